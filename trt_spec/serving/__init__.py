"""Serving a model repository: the Triton launcher and TensorRT-LLM's serving checks."""
