"""What runs inside Triton: the only code a model repository carries.

The repository writer copies this package (and nothing else of ``trt_spec``) beside each python
model's ``model.py``, so a relocated repository needs no ``trt_spec`` install. Its imports are
the standard library, numpy and torch (and transformers in the models that tokenize or run a
checkpoint); never pydantic, yaml, click or the rest of ``trt_spec``.

Read in this order: ``sampling`` (the maths of one verification step), ``loop`` (the draft ->
verify loop, sans I/O), ``tensors`` (every model and tensor name), ``parameters`` (every
model-config parameter), ``bls`` (the loop model's driver), ``text`` (streaming
detokenization), ``torch_engine`` / ``prefix_cache`` / ``twin_engine`` (the torch flavor's
engines), then ``models/`` (the Triton glue, one ``model.py`` per model).
"""
