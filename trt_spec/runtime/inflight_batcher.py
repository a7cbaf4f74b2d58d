"""In-flight batching for the torch flavor's engine models, as TensorRT-LLM's executor does it.

Requests that are in flight together run through *steps*: each step, one forward pass over the
new tokens of every scheduled request (a context chunk, the K + 1 rows of a verification, one
decode token), each request on its own KV cache (:meth:`TorchCausalLM.logits_batch`). A request
is a :meth:`TwinEngine.steps` generator: it hands out the forward pass it needs next and takes
back its logits, so what it computes and draws (its own ``torch.Generator``) is what it would
alone; only the batch it rides in changes.

Each step schedules as the executor of TensorRT-LLM 1.2.x does (the emulator reads the same
sources: ``runtime/trtllm_scheduler.py``):

- the capacity scheduler admits waiting requests in arrival order while fewer than
  ``max_batch_size`` are in flight, and never pauses one it admitted (the default
  ``guaranteed_no_evict`` policy);
- the micro-batch scheduler then walks the requests in flight in order: a request past its
  context costs its new rows (1, or K + 1 for a verification) and the walk stops at the first that
  does not fit in ``max_num_tokens``; a request with context left gets, after those, a chunk of
  what capacity is left, first come first served (chunked context; the twin has no KV blocks, so
  chunks are not floored to a block, and it discards no draft: the verification rows ride with
  the context's last chunk, which is never cut short of them).

Sources:

- ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` @ cf6abc45df6e3470d8c378366896882e1f43e60c
  ``GuaranteedNoEvictScheduler``;
- ``cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp`` @ b8b7b782622c5dc57307f42ea96628f66b34f922
  ``MicroBatchScheduler::operator()``, ``setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>``.

Threads: :meth:`InflightBatcher.submit` may be called from any thread; the steps run on the
batcher's own thread (:meth:`start`), or on the caller's with :meth:`step` (tests).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.twin_engine import EngineAnswer, EngineRequest, ForwardCall, RequestSteps, TwinEngine

# What a submitted request ends with: its answer, or the exception that ended it.
Done = Callable[[EngineAnswer | None, BaseException | None], None]


@dataclass
class _InFlight:
    steps: RequestSteps
    done: Done
    call: ForwardCall  # the forward pass it waits for


@dataclass
class StepStats:
    """What the batcher has run: steps, and rows (tokens), requests and forward-pass seconds over
    all of them."""

    steps: int = 0
    rows: int = 0
    requests: int = 0
    seconds: float = 0.0  # in the steps' forward passes
    widest: int = 0  # most requests in one step
    by_width: dict[int, int] = field(default_factory=dict)  # steps by requests in the step


class InflightBatcher:
    """Runs :class:`TwinEngine` requests together, one forward pass per step.

    ``max_batch_size``: requests in flight at most (at most the engine's cache slots: each holds
    a KV cache); ``max_num_tokens``: rows one step may run.

    Raises (constructor):
        ValueError: a limit below 1, or more requests in flight than the engine keeps caches for.
    """

    def __init__(self, engine: TwinEngine, *, max_batch_size: int, max_num_tokens: int):
        if max_batch_size < 1 or max_num_tokens < 1:
            raise ValueError(f"max_batch_size and max_num_tokens must be >= 1; got {max_batch_size}, {max_num_tokens}")
        if max_batch_size > engine.cache_slots:
            raise ValueError(
                f"max_batch_size {max_batch_size} exceeds the engine's {engine.cache_slots} KV cache slots"
            )
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.stats = StepStats()
        self._waiting: deque[tuple[EngineRequest, torch.Generator | None, Done]] = deque()
        self._in_flight: list[_InFlight] = []
        self._wakeup = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest, generator: torch.Generator | None, done: Done) -> None:
        """Queue a request; ``done(answer, None)`` or ``done(None, error)`` is called once, on the
        stepping thread, when it ends."""
        with self._wakeup:
            if self._closed:
                raise RuntimeError("the in-flight batcher is closed")
            self._waiting.append((request, generator, done))
            self._wakeup.notify()

    def start(self) -> None:
        """Step on a daemon thread of its own until :meth:`close`."""
        self._thread = threading.Thread(target=self._serve, name="trt-spec-inflight-batcher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop stepping once the requests submitted so far have ended."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        if self._thread is not None:
            self._thread.join()

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._in_flight)

    def _serve(self) -> None:
        while True:
            with self._wakeup:
                while not self._waiting and not self._in_flight and not self._closed:
                    self._wakeup.wait()
                if self._closed and not self._waiting and not self._in_flight:
                    return
            self.step()

    # --- one step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Admit what fits, run one forward pass over the scheduled requests, hand each its logits."""
        self._admit()
        if not self._in_flight:
            return
        scheduled, chunks = self._schedule()
        calls = [(entry.call.engine, entry.call.sequence, entry.call.num_positions) for entry in scheduled]
        calls += [(entry.call.engine, entry.call.sequence[:end], 1) for entry, end in chunks]
        started = time.perf_counter()
        try:
            logits = TorchCausalLM.logits_batch(calls)
        except Exception as exc:  # noqa: BLE001 - a failed step fails the requests it ran, not the server
            for entry in scheduled + [entry for entry, _ in chunks]:
                self._finish(entry, None, exc)
            return
        width = len(calls)
        self.stats.seconds += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.requests += width
        self.stats.widest = max(self.stats.widest, width)
        self.stats.by_width[width] = self.stats.by_width.get(width, 0) + 1
        for entry, rows in zip(scheduled, logits):
            try:
                entry.call = entry.steps.send(rows)
            except StopIteration as finished:
                self._finish(entry, finished.value, None)
            except Exception as exc:  # noqa: BLE001 - the request's own failure, reported to its caller
                self._finish(entry, None, exc)

    def _admit(self) -> None:
        # Source: NVIDIA/TensorRT-LLM@cf6abc45df6e3470d8c378366896882e1f43e60c:cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp GuaranteedNoEvictScheduler
        while True:
            with self._wakeup:
                if not self._waiting or len(self._in_flight) >= self.max_batch_size:
                    return
                request, generator, done = self._waiting.popleft()
            steps = self.engine.steps(request, generator)
            try:
                call = next(steps)
            except StopIteration as finished:  # nothing to compute (not reached by the twin's requests)
                done(finished.value, None)
                continue
            except Exception as exc:  # noqa: BLE001 - a refused request (EngineRequestError) ends here
                done(None, exc)
                continue
            self._in_flight.append(_InFlight(steps, done, call))

    def _schedule(self) -> tuple[list[_InFlight], list[tuple[_InFlight, int]]]:
        """The requests whose forward pass runs whole this step, and the context chunks (request,
        the prefix length its cache will hold after the chunk) of those too long for what is left."""
        # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::operator()
        capacity = self.max_num_tokens
        whole: list[_InFlight] = []
        contexts: list[tuple[_InFlight, int]] = []  # (request, its new tokens)
        for entry in self._in_flight:
            call = entry.call
            tokens = call.engine.new_tokens_for(call.sequence, call.num_positions)
            if tokens > call.num_positions:  # context left to run
                contexts.append((entry, tokens))
                continue
            if tokens > capacity:
                break
            whole.append(entry)
            capacity -= tokens
        self.stats.rows += self.max_num_tokens - capacity
        # Source: NVIDIA/TensorRT-LLM@b8b7b782622c5dc57307f42ea96628f66b34f922:cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp MicroBatchScheduler::setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>
        chunks: list[tuple[_InFlight, int]] = []
        for entry, tokens in contexts:
            if capacity <= 0:
                break
            if tokens <= capacity:
                whole.append(entry)
                capacity -= tokens
                self.stats.rows += tokens
                continue
            # A chunk of the context only: its last chunk carries the verification rows whole.
            chunk = min(capacity, tokens - entry.call.num_positions)
            call = entry.call
            chunks.append((entry, len(call.sequence) - tokens + chunk))
            capacity -= chunk
            self.stats.rows += chunk
        if not whole and not chunks:  # one request alone over the limit: run it (the engine checked its length)
            whole.append(self._in_flight[0])
        return whole, chunks

    def _finish(self, entry: _InFlight, answer: EngineAnswer | None, error: BaseException | None) -> None:
        self._in_flight.remove(entry)
        entry.steps.close()  # releases its cache if it ended early
        entry.done(answer, error)
