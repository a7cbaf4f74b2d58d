"""The backend: one engine model as TensorRT-LLM's backend runs it, stage after stage.

:class:`TrtllmBackendEmulator` loads a model config (:mod:`.load`), enqueues each request of a
batch (:mod:`.request`), has the executor validate and schedule them (:mod:`.executor`), runs each
(:mod:`.verify`) and fills its response (``fillTritonResponse``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trt_spec.runtime import engine_interface
from trt_spec.runtime import tensors as T
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.runtime.prefix_cache import PrefixCachePool
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.trtllm_emulator.errors import (
    BackendError,
    _check,
    _CppError,
    _executor_error,
    _load_error,
    _not_emulated,
)
from trt_spec.runtime.trtllm_emulator.executor import _Admitted, draft_probabilities, schedule_batch, validate_request
from trt_spec.runtime.trtllm_emulator.load import LOGITS_DTYPES, BackendConfig, EngineFacts, _check_executor
from trt_spec.runtime.trtllm_emulator.request import BackendRequest, _bool_input
from trt_spec.runtime.trtllm_emulator.verify import decode_tokens, truncate_at_stop, verify_drafts
from trt_spec.runtime.trtllm_scheduler import SchedulingError


class TrtllmBackendEmulator:
    """One engine model (``tensorrt_llm`` or ``tensorrt_llm_draft``) as TensorRT-LLM's backend runs it.

    ``warnings``: what upstream would log as a warning for this model: unusable parameters at load,
    clamped requests since. ``notes``: what upstream logs at debug level that an operator of the
    emulator wants to see (drafts the scheduler discarded). A caller may log and clear both.
    """

    def __init__(self, config: BackendConfig, engine: EngineFacts, model: TorchCausalLM):
        if model.vocab_size != engine.vocab_size:
            raise ValueError(
                f"{engine.role} engine: vocab_size {engine.vocab_size} but the model {engine.hf_model_dir} has "
                f"{model.vocab_size} (the emulator pads no vocabulary)"
            )
        self.config = config
        self.engine = engine
        self.model = model
        self.warnings: list[str] = list(config.warnings)
        self.notes: list[str] = []
        # KV-cache block reuse: the longest cached prefix is resumed, as twin_engine.py does. A cache
        # holding at most a step's tokens past the shared prefix is the same request's (a target's
        # rejected drafts; a draft's unaccepted tokens, up to the K a loop asks for).
        self.pool = PrefixCachePool(
            model, engine.max_batch_size, max_divergence=max(engine.max_draft_len, MAX_DRAFT_TOKENS) + 1
        )
        self._last_request_id = 0

    @classmethod
    def load(
        cls, model_config: Mapping[str, Any], engine: EngineFacts, *, model: TorchCausalLM | None = None
    ) -> TrtllmBackendEmulator:
        """model_config: the dict Triton hands a model's initialize() (json of the unchanged
        tensorrtllm config.pbtxt). Enforces the backend's load-time rules; raises BackendError with
        the backend's message (e.g. "unexpected error when creating modelInstanceState: Cannot find
        parameter with name: tokenizer_dir"). Loads TorchCausalLM.from_pretrained(engine.hf_model_dir)
        when model is None."""
        try:
            config = BackendConfig.parse(model_config)
            _check_executor(config, engine)
        except _CppError as error:
            raise _load_error(error) from None
        if model is None:
            model = TorchCausalLM.from_pretrained(engine.hf_model_dir)
        return cls(config, engine, model)

    def execute(
        self, inputs: Mapping[str, np.ndarray], requested_outputs: Sequence[str], *, request_id: str | None = None
    ) -> dict[str, np.ndarray]:
        """One Triton request on its own: :meth:`execute_batch` of one. Raises its BackendError."""
        result = self.execute_batch([BatchItem(inputs, requested_outputs, request_id)])[0]
        if isinstance(result, BackendError):
            raise result
        return result

    def execute_batch(self, batch: Sequence[BatchItem]) -> list[dict[str, np.ndarray] | BackendError]:
        """Triton requests that reached the executor together (one ``execute`` of the model), in
        arrival order: inputs by name WITH the batch dimension as Triton delivers them;
        requested_outputs as the caller requested them (empty: Triton's "all outputs"). Returns,
        per request, its outputs by name with their backend shapes (``{}`` for a ``stop``
        request: the empty final response), or the BackendError with the backend's message for
        every rule it enforces. ``request_id``: Triton's request id, checked only for a ``stop``
        request when given (None: unknown). The admitted requests are scheduled together
        (:mod:`~trt_spec.runtime.trtllm_scheduler`), so one request's drafts may be discarded
        because of the others, as upstream.
        """
        results: list[dict[str, np.ndarray] | BackendError | None] = [None] * len(batch)
        admitted: list[_Admitted] = []
        for index, item in enumerate(batch):
            try:
                admission = self._admit(item, index)
            except BackendError as error:
                results[index] = error
                continue
            if admission is None:
                results[index] = {}  # a stop request
            else:
                admitted.append(admission)
        try:
            schedule_batch(admitted, self.engine, self.config, self.pool, self.notes.append)
        except SchedulingError as error:
            for entry in admitted:
                cause = _CppError(str(error))
                results[entry.index] = _executor_error(entry.id, "Encountered an error in forwardAsync function", cause)
            admitted = []
        for entry in admitted:
            try:
                results[entry.index] = self._run(entry)
            except BackendError as error:
                results[entry.index] = error
        return [result if result is not None else {} for result in results]

    def _admit(self, item: BatchItem, index: int) -> _Admitted | None:
        """The enqueue and the executor's validation of the batch's ``index``-th request (None: a
        stop request)."""
        inputs = item.inputs
        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::handleStopRequest
        if _bool_input(inputs, T.STOP.name):
            if item.request_id == "":
                raise BackendError("Trying to stop a request but request ID is not provided", stage="enqueue")
            return None  # nothing of this request runs here, so there is nothing to cancel

        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::enqueue (the error text is sent as it is)
        try:
            request = BackendRequest.from_tensors(inputs, self.config)
        except _CppError as error:
            raise BackendError(str(error), stage="enqueue") from None
        self._last_request_id += 1
        request_id_number = self._last_request_id
        try:
            draft_tokens, max_new_tokens = validate_request(request, self.engine, self.warnings.append)
        except _CppError as error:
            raise _executor_error(request_id_number, "Encountered an error when fetching new request", error) from None
        return _Admitted(request_id_number, request, draft_tokens, max_new_tokens, tuple(item.requested_outputs), index)

    def _run(self, entry: _Admitted) -> dict[str, np.ndarray]:
        """The decoder's setup, the step(s) and the response of one scheduled request."""
        request, draft_tokens = entry.request, entry.draft_tokens
        try:
            draft_probs = draft_probabilities(draft_tokens, entry.draft_logits, self.engine)
        except _CppError as error:
            raise _executor_error(entry.id, "Encountered an error in forwardAsync function", error) from None

        vocab = self.engine.vocab_size
        if request.embedding_bias_size not in (0, vocab):
            raise _not_emulated(
                f"an embedding_bias of {request.embedding_bias_size} values (emulated: one per vocabulary entry, {vocab})"
            )
        if any(not 0 <= token < vocab for token in (*request.input_tokens, *draft_tokens)):
            raise _not_emulated(f"a token id outside [0, {vocab}) in input_ids or draft_input_ids (undefined upstream)")
        sampling = request.sampling_params(self.warnings.append)
        generator = torch.Generator().manual_seed(request.seed)  # a constant seed repeats the randomness
        prompt = list(request.input_tokens)
        if draft_tokens:
            tokens, logits = self._verify(request, prompt, draft_tokens, draft_probs, sampling, generator)
        else:
            tokens, logits = self._decode(request, prompt, entry.max_new_tokens, sampling, generator)

        try:
            return self._fill(request, prompt, tokens, logits, entry.requested_outputs, draft_tokens)
        except _CppError as error:
            # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
            raise BackendError(f"Error encountered while populating response: {error}", stage="response") from None

    # --- stages ------------------------------------------------------------------------------

    def _decode(
        self,
        request: BackendRequest,
        prompt: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor]]:
        engine = self.pool.engine_for(prompt)
        return decode_tokens(
            lambda sequence: engine.logits(sequence, 1)[0],
            prompt,
            max(1, max_new_tokens),  # a clamp to <= 0 still runs the context step (unconfirmed)
            sampling,
            end_id=request.end_id,
            stop_words=request.stop_words,
            generator=generator,
            penalties=request.penalties,
            temperature=request.score_temperature,
        )

    def _verify(
        self,
        request: BackendRequest,
        prompt: list[int],
        drafts: list[int],
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[list[int], list[torch.Tensor]]:
        """ONE engine step over prompt + drafts: accepted + 1 tokens, whatever request_output_len."""
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (a draft-tokens request terminates after one step)
        sequence = prompt + drafts
        target_logits = self.pool.engine_for(sequence).logits(sequence, len(drafts) + 1)  # [k + 1, V]
        emitted = verify_drafts(
            drafts,
            target_logits,
            sampling,
            draft_probs=draft_probs,
            threshold=request.draft_acceptance_threshold,
            generator=generator,
            context=prompt,
            end_id=request.end_id,
            penalties=request.penalties,
            temperature=request.score_temperature,
        )
        tokens = truncate_at_stop(prompt, emitted, request.end_id, request.stop_words)
        # Generation logits of a draft-tokens request: one row per token added, so none when the
        # first new token is end_id (which never advances the sequence length).
        # Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (numAcceptedTokens)
        return tokens, list(target_logits[: len(tokens)])

    def _fill(
        self,
        request: BackendRequest,
        prompt: list[int],
        tokens: list[int],
        logits: list[torch.Tensor],
        requested_outputs: Sequence[str],
        draft_tokens: Sequence[int] = (),
    ) -> dict[str, np.ndarray]:
        # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse
        names = set(requested_outputs) if requested_outputs else set(self.config.outputs)
        ids = tokens if request.exclude_input_from_output else prompt + tokens
        outputs = {}
        if T.OUTPUT_IDS.name not in names:
            raise _CppError(f"{T.OUTPUT_IDS.name} tensor must be present in list of output tensors")
        outputs[T.OUTPUT_IDS.name] = np.array(ids, dtype=np.int32).reshape(1, 1, len(ids))  # [1, beams, n]
        if T.SEQUENCE_LENGTH.name not in names:
            raise _CppError(f"{T.SEQUENCE_LENGTH.name} tensor must be present in list of output tensors")
        outputs[T.SEQUENCE_LENGTH.name] = np.array([[len(ids)]], dtype=np.int32)  # [1, beams]
        if T.GENERATION_LOGITS.name in names and request.return_generation_logits:
            _check(
                self.config.logits_dtype == self.engine.logits_dtype,
                "generationLogitsType == model_state_->getLogitsDataType()",
            )
            vocab = self.engine.vocab_size
            rows = torch.stack(logits).numpy() if logits else np.zeros((0, vocab), np.float32)  # [n, V] raw
            rows = rows.astype(LOGITS_DTYPES[self.engine.logits_dtype])
            outputs[T.GENERATION_LOGITS.name] = rows.reshape(1, 1, *rows.shape)  # [1, beams, n, V]
        if request.return_log_probs:
            log_probs = engine_interface.log_prob_outputs(
                logits,
                prompt,
                tokens,
                temperature=request.score_temperature,
                penalties=request.penalties,
                end_id=request.end_id,
                top_k=engine_interface.log_prob_top_k(request.top_k, request.top_p),
                normalize=bool(self.config.parameters["normalize_log_probs"]),
            )
            outputs.update({name: array for name, array in log_probs.items() if name in names})
        counts = engine_interface.token_count_outputs(
            len(request.input_tokens),
            len(ids),
            input_count=request.return_num_input_tokens,
            output_count=request.return_num_output_tokens,
        )
        outputs.update({name: array for name, array in counts.items() if name in names})
        if request.return_perf_metrics:
            outputs.update(_speculative_metrics(names, draft_tokens, tokens, self.engine))
        return outputs


def _speculative_metrics(
    names: set[str], draft_tokens: Sequence[int], tokens: Sequence[int], engine: EngineFacts
) -> dict[str, np.ndarray]:
    """The speculative-decoding perf metrics of one finished request, as the executor counts them:
    for a target request that verified drafts, the drafts it verified (after any discarded) and
    the tokens it added past the first; zero otherwise. Only the outputs requested are filled."""
    # Source: NVIDIA/TensorRT-LLM@d879430b040ea30c65220c9171a8a70607398748:cpp/include/tensorrt_llm/batch_manager/llmRequest.h LlmRequest::updateNumTokensPerIteration
    # Source: NVIDIA/TensorRT-LLM@c8c6df08bd0ead54cd47f7973e1e425c28a174cd:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse (processStats)
    drafted = min(len(draft_tokens), engine.max_draft_len) if engine.is_target else 0
    accepted = max(0, len(tokens) - 1) if drafted else 0  # numTokensPerIteration - 1
    rate = accepted / drafted if drafted else 0.0  # set where the request finishes (unconfirmed when 0 drafts)
    values = {
        T.ENGINE_TOTAL_DRAFT_TOKENS.name: np.array([[drafted]], dtype=np.int32),
        T.ENGINE_TOTAL_ACCEPTED_DRAFT_TOKENS.name: np.array([[accepted]], dtype=np.int32),
        T.ENGINE_ACCEPTANCE_RATE.name: np.array([[rate]], dtype=np.float32),
    }
    return {name: array for name, array in values.items() if name in names}


@dataclass(frozen=True)
class BatchItem:
    """One Triton request of a batch, as :meth:`TrtllmBackendEmulator.execute_batch` takes it."""

    inputs: Mapping[str, np.ndarray]
    requested_outputs: Sequence[str] = ()
    request_id: str | None = None
