"""What both flavors' engine models answer of TensorRT-LLM 1.2.x's ``tensorrt_llm`` interface
beyond decoding, so that upstream's clients get the same answers from either.

- **Inputs declared but not supported** (:data:`UNSUPPORTED_INPUTS`: encoder-decoder, multimodal,
  prompt tuning, LoRA, beam search, top-p decay, lookahead, guided decoding, KV-cache retention,
  disaggregated serving): accepted when absent, empty or holding a value that changes nothing
  (upstream's default), else refused with one line naming the input (:func:`unsupported_input`).
- ``num_return_sequences``: 1 (or absent); more is refused (:func:`num_return_sequences_error`).
- ``return_log_probs``: ``output_log_probs`` ``[1, 1, n]`` and ``cum_log_probs`` ``[1, 1]`` of
  the generated tokens (:func:`log_prob_outputs`); refused with ``draft_input_ids``
  (:data:`LOG_PROBS_WITH_DRAFTS`).
- ``return_num_input_tokens`` / ``return_num_output_tokens``: ``num_input_tokens`` and
  ``num_output_tokens`` (:func:`token_count_outputs`).

Each flavor wraps the messages in its own error (``twin_engine.EngineRequestError``,
``trtllm_emulator.BackendError``). numpy and torch only: copied into model repositories with the
rest of :mod:`trt_spec.runtime`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trt_spec.runtime import tensors as T
from trt_spec.runtime.penalties import Penalties, adjusted_scores

# Source: NVIDIA/TensorRT-LLM@e41b05cdc69021efb4116ed5f32eeb1840a47981:cpp/tensorrt_llm/kernels/samplingTopKKernels.h clampTopK
TOP_K_MAX = 1024


# --- inputs declared but not supported ---------------------------------------------------------


@dataclass(frozen=True)
class Unsupported:
    """An input upstream's engine model reads and ours declares without supporting it.

    ``neutral``: the values that change nothing (upstream's defaults); an empty tensor is always
    neutral, and an input without neutral values is accepted only absent or empty.
    """

    tensor: T.Tensor
    feature: str  # what the input drives, for the message
    neutral: tuple[bool | int | float | bytes, ...] = ()

    def accepts(self, array: np.ndarray) -> bool:
        values = np.asarray(array).reshape(-1)
        return all(any(_same(value, neutral) for neutral in self.neutral) for value in values.tolist())

    def message(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        given = f"{_shown(array.reshape(-1)[0])}" if array.size == 1 else f"a tensor of shape {list(array.shape)}"
        scalar = self.tensor.dims == (1,)
        options = ["omit it", *([] if scalar else ["send it empty"])]
        options += [f"send {'' if scalar else 'only '}{_shown(value)}" for value in self.neutral]
        send = " or ".join(options)
        return f"{self.tensor.name} = {given} is not supported by this repository ({self.feature}): {send}"


def _same(value: object, neutral: object) -> bool:
    if isinstance(neutral, float):  # compared as the FP32 the tensor holds
        return isinstance(value, (int, float)) and np.float32(value) == np.float32(neutral)
    if isinstance(neutral, bool):
        return isinstance(value, (bool, np.bool_)) and bool(value) == neutral
    return type(value) is type(neutral) and value == neutral


def _shown(value: object) -> str:
    if isinstance(value, bytes):
        return repr(value.decode("utf-8", "replace"))
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_ENCODER_DECODER = "encoder-decoder models"
_MULTIMODAL = "multimodal models"
_PROMPT_TUNING = "prompt tuning"
_BEAM_SEARCH = "beam search; the engine models decode one beam"
_TOP_P_DECAY = "top-p decay"
_RETENTION = "KV-cache retention priorities"
_LOOKAHEAD = "lookahead decoding"
# The neutral values are upstream's defaults for an absent input:
# Source: NVIDIA/TensorRT-LLM@21c8b6d4b656cd3e6e89698ee2bf882344b3cd01:cpp/include/tensorrt_llm/layers/defaultDecodingParams.h DefaultDecodingParams (topPMin 1e-6, topPDecay 1, topPResetId -1, lengthPenalty 0, earlyStopping 1, beamSearchDiversity 0)
# Source: NVIDIA/TensorRT-LLM@192908136e53ddfc2f282e81e6ecdb76af06eb50:triton_backend/inflight_batcher_llm/src/utils.cc getSamplingConfigFromTensors, getPromptTuningConfigFromTensors, getLoraConfigFromTensors, getKvCacheRetentionConfigFromTensors
UNSUPPORTED_INPUTS = (
    Unsupported(T.ENCODER_INPUT_FEATURES, _ENCODER_DECODER),
    Unsupported(T.ENCODER_OUTPUT_LENGTHS, _ENCODER_DECODER, (0,)),
    Unsupported(T.DECODER_INPUT_IDS, _ENCODER_DECODER),
    Unsupported(T.DECODER_INPUT_LENGTHS, _ENCODER_DECODER, (0,)),
    Unsupported(T.RUNTIME_TOP_P_MIN, _TOP_P_DECAY, (1e-6,)),
    Unsupported(T.RUNTIME_TOP_P_DECAY, _TOP_P_DECAY, (1.0,)),
    Unsupported(T.RUNTIME_TOP_P_RESET_IDS, _TOP_P_DECAY, (-1,)),
    # 1.0 too, as the ensemble's length_penalty: with one beam neither changes anything.
    Unsupported(T.LEN_PENALTY, _BEAM_SEARCH, (0.0, 1.0)),
    Unsupported(T.EARLY_STOPPING, _BEAM_SEARCH, (True,)),
    Unsupported(T.BEAM_SEARCH_DIVERSITY_RATE, _BEAM_SEARCH, (0.0,)),
    Unsupported(T.ENGINE_PROMPT_EMBEDDING_TABLE, _PROMPT_TUNING),
    Unsupported(T.PROMPT_TABLE_EXTRA_IDS, _PROMPT_TUNING, (0,)),  # 0: a token without extra id
    Unsupported(T.ENGINE_PROMPT_VOCAB_SIZE, _PROMPT_TUNING, (0,)),
    Unsupported(T.CROSS_ATTENTION_MASK, _MULTIMODAL),
    Unsupported(T.MROPE_ROTARY_COS_SIN, _MULTIMODAL),
    Unsupported(T.MROPE_POSITION_DELTAS, _MULTIMODAL, (0,)),
    Unsupported(T.ENGINE_LORA_TASK_ID, "LoRA"),
    Unsupported(T.LORA_WEIGHTS, "LoRA"),
    Unsupported(T.LORA_CONFIG, "LoRA"),
    Unsupported(T.CONTEXT_PHASE_PARAMS, "disaggregated serving"),
    Unsupported(T.SKIP_CROSS_ATTN_BLOCKS, _MULTIMODAL, (False,)),
    Unsupported(T.RETENTION_TOKEN_RANGE_STARTS, _RETENTION),
    Unsupported(T.RETENTION_TOKEN_RANGE_ENDS, _RETENTION),
    Unsupported(T.RETENTION_TOKEN_RANGE_PRIORITIES, _RETENTION),
    Unsupported(T.RETENTION_TOKEN_RANGE_DURATIONS_MS, _RETENTION),
    Unsupported(T.RETENTION_DECODE_PRIORITY, _RETENTION),
    Unsupported(T.RETENTION_DECODE_DURATION_MS, _RETENTION),
    Unsupported(T.GUIDED_DECODING_GUIDE_TYPE, "guided decoding", (b"",)),
    Unsupported(T.GUIDED_DECODING_GUIDE, "guided decoding", (b"",)),
    Unsupported(T.LOOKAHEAD_WINDOW_SIZE, _LOOKAHEAD),
    Unsupported(T.LOOKAHEAD_NGRAM_SIZE, _LOOKAHEAD),
    Unsupported(T.LOOKAHEAD_VERIFICATION_SET_SIZE, _LOOKAHEAD),
)


def unsupported_input(inputs: Mapping[str, np.ndarray]) -> str | None:
    """The message for the first input (in the config's order) that this repository declares,
    does not support and the request sends with a value that is not neutral; None when there is none."""
    for entry in UNSUPPORTED_INPUTS:
        array = inputs.get(entry.tensor.name)
        if array is not None and not entry.accepts(array):
            return entry.message(array)
    return None


def num_return_sequences_error(inputs: Mapping[str, np.ndarray]) -> str | None:
    """None for a ``num_return_sequences`` of 1 or none; else the message refusing it."""
    array = inputs.get(T.ENGINE_NUM_RETURN_SEQUENCES.name)
    if array is None:
        return None
    array = np.asarray(array)
    if array.size != 1:
        return f"{T.ENGINE_NUM_RETURN_SEQUENCES.name} must hold one value; got shape {list(array.shape)}"
    value = array.reshape(-1)[0].item()
    if value == 1:
        return None
    return (
        f"{T.ENGINE_NUM_RETURN_SEQUENCES.name} = {value} is not supported by this repository: a request returns one "
        "sequence; send 1 or omit it, and send the request once per sequence wanted (with different seeds)"
    )


# Source: NVIDIA/TensorRT-LLM@b35ac1b64368513d215c57d2ed01d62d910df8da:cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp TrtGptModelInflightBatching::updateRequests (copies the decoder's log probs per token added)
# Source: NVIDIA/TensorRT-LLM@1d263f15a979ef2902c60de3f6238bcc0952bb29:cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp ExternalDraftTokensLayer::acceptDraftTokens (no log-prob buffers passed to the kernels)
LOG_PROBS_WITH_DRAFTS = (
    f"{T.ENGINE_RETURN_LOG_PROBS.name} with {T.DRAFT_INPUT_IDS.name} is not supported by this repository: TensorRT-LLM "
    "returns undefined log probs for a request that verifies draft tokens; send return_log_probs only without "
    "draft_input_ids (the loop computes the verified tokens' log probs from generation_logits)"
)


# --- log probs ---------------------------------------------------------------------------------


def log_prob_top_k(top_k: int | None, top_p: float | None) -> int:
    """The k of the top-k sampling kernel that draws a request's tokens, or 0 when the top-p kernel
    does (top-k 0 with a top-p): upstream regularises an absent top-k and top-p to top-k 1 (greedy
    has no kernel of its own) and clips top-k to :data:`TOP_K_MAX`. ``top_p`` <= 0 is absent."""
    # Source: NVIDIA/TensorRT-LLM@e41b05cdc69021efb4116ed5f32eeb1840a47981:cpp/tensorrt_llm/kernels/samplingTopKKernels.h clampTopK, regularizeTopKTopP
    k = min(max(0, top_k or 0), TOP_K_MAX)
    p = top_p if top_p is not None and top_p > 0 else 0.0
    return 1 if k == 0 and p == 0.0 else k


def token_log_probs(
    scores: torch.Tensor, tokens: Sequence[int], top_k: int, *, normalize: bool
) -> tuple[list[float], list[float]]:
    """``(output_log_probs, plain)`` of ``tokens``, row i of ``scores`` ``[n, V]`` (the runtime
    logits the token was drawn from: after embedding bias, temperature, penalties, min_tokens and
    bad words) scoring token i.

    plain = log p with p the softmax of the scores (float32, as the sampling layer computes it);
    ``cum_log_probs`` adds these. The top-k kernel (``top_k`` > 0) reports log p minus the log of
    the k most likely tokens' total probability when ``normalize`` (``normalize_log_probs``): 0.0
    for a greedy token. The top-p kernel (``top_k`` 0) reports plain log p.
    """
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:cpp/tensorrt_llm/kernels/samplingTopKKernels.cu topKStage2Sampling (logitHasProbs: logf(p) into cumLogProbs; minus logf(sSum) into outputLogProbs when normalizeLogProbs)
    if not tokens:
        return [], []
    probs = scores.float().softmax(dim=-1)  # [n, V]
    rows = torch.arange(len(tokens))
    plain = probs[rows, torch.tensor(list(tokens))].log()  # [n]
    reported = plain
    if top_k > 0 and normalize:
        candidates = probs.topk(min(top_k, probs.shape[-1]), dim=-1).values  # [n, k]
        reported = plain - candidates.sum(dim=-1).log()
    return reported.tolist(), plain.tolist()


def log_prob_outputs(
    raw_logits: Sequence[torch.Tensor],
    prompt: Sequence[int],
    tokens: Sequence[int],
    *,
    temperature: float,
    penalties: Penalties,
    end_id: int | None,
    top_k: int,
    normalize: bool,
) -> dict[str, np.ndarray]:
    """``output_log_probs`` ``[1, 1, n]`` and ``cum_log_probs`` ``[1, 1]`` (float32) of the ``n``
    tokens one decoding call generated after ``prompt``: ``raw_logits`` holds each one's raw
    logits (``[V]`` or ``[1, V]``, at least n), adjusted here as the call adjusted them
    (:func:`~trt_spec.runtime.penalties.adjusted_scores`; ``penalties``: the call's, ``temperature``:
    the one sent, else 1). Generated tokens only, never the prompt's."""
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::fillTritonResponse (output_log_probs [1, beams, n], cum_log_probs [1, beams])
    reported: list[float] = []
    plain: list[float] = []
    if tokens:
        rows = torch.stack([logits.reshape(-1) for logits in raw_logits[: len(tokens)]])  # [n, V]
        scores = adjusted_scores(rows, temperature, penalties, prompt, tokens, end_id)
        reported, plain = token_log_probs(scores, tokens, top_k, normalize=normalize)
    cumulative = np.float32(0.0)
    for value in plain:  # the kernel's float32 running sum
        cumulative = np.float32(cumulative + np.float32(value))
    return {
        T.ENGINE_OUTPUT_LOG_PROBS.name: np.array(reported, dtype=np.float32).reshape(1, 1, len(reported)),
        T.ENGINE_CUM_LOG_PROBS.name: np.array([[cumulative]], dtype=np.float32),
    }


# --- token counts ------------------------------------------------------------------------------


def token_count_outputs(
    num_input_tokens: int, num_output_ids: int, *, input_count: bool, output_count: bool
) -> dict[str, np.ndarray]:
    """``num_input_tokens`` (the request's input tokens) and ``num_output_tokens`` (every id of the
    response's ``output_ids``: the prompt's too when it is not excluded), each ``[1, 1]`` int32,
    those asked for."""
    # Source: NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/inflight_batcher_llm/src/model_instance_state.cc ModelInstanceState::enqueue (inputTokensSize = getInputTokenIds().size()), fillTritonResponse (outputTokensSize: the output ids of every beam)
    outputs = {}
    if input_count:
        outputs[T.ENGINE_NUM_INPUT_TOKENS.name] = np.array([[num_input_tokens]], dtype=np.int32)
    if output_count:
        outputs[T.ENGINE_NUM_OUTPUT_TOKENS.name] = np.array([[num_output_ids]], dtype=np.int32)
    return outputs
