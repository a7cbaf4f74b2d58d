"""TensorRT-LLM engines.

- :mod:`~trt_spec.engines.build`: ``trtllm-build`` carried out from a plan (probing the machine first);
- :mod:`~trt_spec.engines.manifest`: the ``manifest.json`` beside a checkpoint or engine, and the build key;
- :mod:`~trt_spec.engines.versions`: the installed TensorRT-LLM and TensorRT versions.
"""
