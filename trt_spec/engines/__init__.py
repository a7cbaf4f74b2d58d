"""TensorRT-LLM engines: ``trtllm-build`` carried out from a plan, manifests, tool versions."""
