"""Benchmarks: speculative against plain decoding, in-process and through a server."""
