"""Benchmarks: speculative against plain decoding, in-process and through a server. The cost
model they compare with is ``trt_spec.runtime.costs``, the one ``plan`` projects with.

The modules, in reading order:

- ``prompts``: the packaged held-out prompts, as texts, cut texts (server) or tokens (in-process).
- ``rows``: what a benchmark reports: the tally of a configuration's requests and the typed
  result rows made from tallies, each with ``to_json()`` (a row of ``trt-spec bench --json``).
- ``inprocess``: the benchmark on the PyTorch twin, against plain decoding and Hugging Face
  assisted generation, with the step timings and the K recommendation.
- ``profile``: where one iteration of the in-process loop spends its time (``bench --profile``).
- ``server``: the benchmark through a running server, with its metrics and the loop's overhead.
- ``plot``: the PNGs of both benchmarks.
"""
