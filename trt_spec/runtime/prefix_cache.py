"""KV caches keyed by token prefix, for an engine that serves many sequences without a session key.

TensorRT-LLM's engine models take the whole sequence on every call and nothing that names the
request it belongs to; with KV-cache block reuse they find the longest prefix they have already
computed and run only the rest. :class:`PrefixCachePool` does the same for the PyTorch twin: a
least-recently-used set of :class:`~trt_spec.runtime.torch_engine.TorchCausalLM` caches over
one model's weights, and each call resumes from the cache holding the longest prefix of its
sequence.

Which cache a call gets:

1. the one sharing the longest prefix, in place, when what it holds beyond that prefix is at most
   ``max_divergence`` tokens: the same request one step later (its rejected drafts are cropped);
2. otherwise an empty cache, a fresh one (while fewer than ``capacity`` exist), or the least recently used one,
   first given a copy of the longest shared prefix, so a new request never destroys the cache of
   one still running, yet starts from any prompt prefix already computed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trt_spec.runtime.loop import common_prefix_length
from trt_spec.runtime.torch_engine import TorchCausalLM


class PrefixCachePool:
    """An LRU of KV caches over one model; :meth:`engine_for` picks the cache for a sequence.

    ``capacity``: how many sequences keep a cache at once (a server sizes it from its
    ``max_batch_size``). ``max_divergence``: how many cached tokens past the shared prefix still
    mean "the same request" (K + 1: a step's drafts, which a rejection crops).

    Raises (constructor):
        ValueError: capacity < 1 or max_divergence < 0.
    """

    def __init__(self, engine: TorchCausalLM, capacity: int, max_divergence: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1; got {capacity}")
        if max_divergence < 0:
            raise ValueError(f"max_divergence must be >= 0; got {max_divergence}")
        self.capacity = capacity
        self.max_divergence = max_divergence
        self._base = engine
        self._engines: list[TorchCausalLM] = [engine]  # least recently used first

    def __len__(self) -> int:
        return len(self._engines)

    def longest_cached_prefix(self, sequence: Sequence[int]) -> int:
        """Tokens of ``sequence`` some cache already holds (what a KV-cache lookup would reuse)."""
        return max(common_prefix_length(engine.cached_tokens, sequence) for engine in self._engines)

    def engine_for(self, sequence: Sequence[int], busy: Collection[TorchCausalLM] = ()) -> TorchCausalLM:
        """The engine (cache) to run ``sequence`` on; it becomes the most recently used.

        ``busy``: caches held by other requests in flight (an in-flight batch): never chosen, but
        their prefixes are copied from like any other's.

        Raises:
            RuntimeError: every one of ``capacity`` caches is busy (the caller admits at most
                ``capacity`` requests at once).
        """
        shared = [common_prefix_length(engine.cached_tokens, sequence) for engine in self._engines]
        # max() keeps the first of equals; search from the most recent end.
        best_index = max(range(len(self._engines) - 1, -1, -1), key=shared.__getitem__)
        best, best_shared = self._engines[best_index], shared[best_index]
        free = [engine for engine in self._engines if engine not in busy]  # least recently used first
        empty = next((engine for engine in free if engine.cached_length == 0), None)
        if best_shared > 0 and best not in busy and best.cached_length - best_shared <= self.max_divergence:
            chosen = best
        elif empty is not None and best_shared == 0:
            chosen = empty
        elif len(self._engines) < self.capacity:
            chosen = self._base.fork()
            self._engines.append(chosen)
            if best_shared > 0:
                chosen.copy_prefix_from(best, best_shared)
        elif free:
            chosen = free[0]
            if chosen is not best and best_shared > common_prefix_length(chosen.cached_tokens, sequence):
                chosen.copy_prefix_from(best, best_shared)
        else:
            raise RuntimeError(f"all {self.capacity} KV caches are held by requests in flight")
        self._engines.remove(chosen)
        self._engines.append(chosen)
        return chosen
