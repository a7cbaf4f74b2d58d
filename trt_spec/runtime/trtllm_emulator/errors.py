"""The emulator's errors: how each stage's failure reaches a client, in upstream's words.

Message texts are upstream's: a ``TLLM_CHECK`` failure reads ``[TensorRT-LLM][ERROR] Assertion
failed: <info>``; the `` (<file>:<line>)`` and stack trace that ``TllmException`` appends to
every ``TLLM_CHECK``/``TLLM_THROW`` text are left out (match messages by prefix or substring).
:class:`BackendError` also carries ``stage`` (``load``, ``enqueue``, ``executor``, ``response``,
or ``emulator`` for what the emulator cannot do and what this repository does not support: the
inputs :mod:`~trt_spec.runtime.engine_interface` refuses unless neutral, ``num_return_sequences``
above 1, ``return_log_probs`` with ``draft_input_ids``; upstream would run those).

Standard library only.
"""

from __future__ import annotations


class BackendError(Exception):
    """An error as TensorRT-LLM's backend reports it; str() is the message text a client sees.

    ``stage``: where upstream raises it: ``load``, ``enqueue``, ``executor``, ``response``, or
    ``emulator`` (something this emulator does not reproduce; not an upstream message).
    """

    def __init__(self, message: str, *, stage: str):
        super().__init__(message)
        self.message = message
        self.stage = stage

    def __str__(self) -> str:
        return self.message


class _CppError(Exception):
    """An exception thrown inside the backend: str() is its ``what()``. Each stage wraps it into
    a :class:`BackendError` the way upstream turns it into a Triton error."""


def _check(condition: bool, info: str) -> None:
    """``TLLM_CHECK_WITH_INFO(condition, info)`` (``TLLM_CHECK(expr)``: info is the expression text)."""
    # Source: NVIDIA/TensorRT-LLM@0c6a62a1d7ca643ceeaa3413b6833e164d324667:cpp/include/tensorrt_llm/common/tllmException.h throwRuntimeError
    if not condition:
        raise _CppError(f"[TensorRT-LLM][ERROR] Assertion failed: {info}")


def _load_error(error: _CppError) -> BackendError:
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::Create
    return BackendError(f"unexpected error when creating modelInstanceState: {error}", stage="load")


def _executor_error(request_id: int, where: str, error: _CppError) -> BackendError:
    # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/executor/executorImpl.cpp Executor::Impl::fetchNewRequests, Executor::Impl::forwardAsync
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
    return BackendError(
        f"Executor failed process requestId {request_id} due to the following error: {where}: {error}", stage="executor"
    )


def _not_emulated(what: str) -> BackendError:
    return BackendError(f"TensorRT-LLM backend emulator: {what} is not emulated", stage="emulator")


def _unsupported(message: str) -> BackendError:
    """What this repository refuses though upstream would run it (engine_interface's messages)."""
    return BackendError(f"TensorRT-LLM backend emulator: {message}", stage="emulator")
