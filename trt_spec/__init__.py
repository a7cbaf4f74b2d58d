"""trt-spec: draft-target speculative decoding with TensorRT-LLM engines behind Triton."""

__version__ = "0.1.0"
