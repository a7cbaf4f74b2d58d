"""Every Triton model name and tensor (name, dtype, shape) of the repository, defined once.

Imported by the config generator (``configs.py``), the Triton models (the writer copies this file
beside each ``model.py``, so a relocated repository needs no ``trt_spec`` install) and the
client. Standard library only: it is loaded inside Triton's python-backend stub.

Shapes are per request *without* the batch dimension: every model has ``max_batch_size`` > 0, so
a client sends a scalar as shape ``[1, 1]``, and a request of N prompts (as TensorRT-LLM's
ensemble takes them) ``[N, 1]``. The ensemble answers each prompt on its own responses (``[1, ...]``
tensors; ``batch_index`` when N > 1; the Triton final flag on the request's last response), and
``text_output`` is 1-D ``[1]``, as TensorRT-LLM's postprocessing returns it (its clients read
``as_numpy("text_output")[0]``). The engine models keep TensorRT-LLM
1.2.x's own tensor names, dtypes and dims (``triton_backend/inflight_batcher_llm/src/utils.h``
and the ``tensorrt_llm/config.pbtxt`` template), so the loop model is the same for both flavors;
their scalars are ``dims: [1]`` with ``reshape: []`` as there.

Streaming-safe detokenization (loop model -> postprocessing)
------------------------------------------------------------
Each response of a request passes through ``postprocessing`` as an independent request, so
postprocessing keeps no state. Instead every loop response carries a small window of tokens:

- ``output_ids`` = ``generated[w:n]``: the tokens generated so far from a window start ``w`` on;
- ``num_context_tokens`` = ``m - w``: how many of them earlier responses already covered
  (``m`` = tokens generated before this response); the rest are new;
- ``is_final``: this is the request's last response (nothing more will follow).

The loop chooses ``w = window_start(m) = max(0, m - DETOKENIZE_CONTEXT_TOKENS)``. Postprocessing decodes the window
twice, ``a = decode(output_ids[:num_context_tokens])`` and ``b = decode(output_ids)``, drops from
each (unless ``is_final``) at most ONE trailing U+FFFD — the only character that later bytes can
still change (an incomplete UTF-8 sequence decodes to exactly one U+FFFD; every earlier one is
final) — and sends ``b[len(a):]``. Both decodes start at the same token, so whatever a window
start does to the first characters (a split multi-byte character, a SentencePiece leading space)
is the same in both and cancels; the held-back character is re-decoded by the next response, whose
window still reaches back to it. The deltas therefore concatenate to
``decode(all generated tokens)``, multi-byte characters included. Decoding uses
``skip_special_tokens=True, clean_up_tokenization_spaces=False`` (clean-up rewrites earlier text,
e.g. ``" ." -> "."``, which no stream can take back).
"""

from __future__ import annotations

from dataclasses import dataclass

# Model names. TensorRT-LLM 1.2.x's own (its triton_backend/all_models/inflight_batcher_llm models;
# tensorrt_llm_draft as its draft-target recipe names the draft engine), each speaking the interface
# of its upstream namesake, so upstream's clients and recipes find what they expect:
TARGET = "tensorrt_llm"
DRAFT = "tensorrt_llm_draft"
# The two engines' roles, as the spec, the plan, the layout and the engine models name them.
ROLES = ("target", "draft")
ENGINE_MODELS = {"target": TARGET, "draft": DRAFT}  # role -> engine model name
ENSEMBLE = "ensemble"
TRTLLM_PREPROCESSING = "preprocessing"  # QUERY, REQUEST_OUTPUT_LEN, ... -> INPUT_ID, ... (unary)
TRTLLM_POSTPROCESSING = "postprocessing"  # TOKENS_BATCH, SEQUENCE_LENGTH -> OUTPUT (unary)
BLS = "tensorrt_llm_bls"  # text in, text out: the ensemble's pipeline under upstream BLS's interface
# Ours, behind the ensemble and tensorrt_llm_bls: their interfaces are this file's own.
PREPROCESSING = "spec_preprocessing"
LOOP = "spec_loop"
POSTPROCESSING = "spec_postprocessing"
MODEL_NAMES = (
    PREPROCESSING,
    TARGET,
    DRAFT,
    LOOP,
    POSTPROCESSING,
    ENSEMBLE,
    TRTLLM_PREPROCESSING,
    TRTLLM_POSTPROCESSING,
    BLS,
)

# Tokens of already-streamed text the loop resends with each response (see the module docstring):
# enough for one held-back character (<= 3 bytes of an incomplete UTF-8 sequence, >= 1 byte per
# token) plus a window start that falls inside another multi-byte character (<= 3 tokens).
DETOKENIZE_CONTEXT_TOKENS = 8


def window_start(num_sent_tokens: int) -> int:
    """Where the loop's next ``output_ids`` window starts, after ``num_sent_tokens`` generated
    tokens went out in earlier responses (``num_context_tokens`` = the difference)."""
    return max(0, num_sent_tokens - DETOKENIZE_CONTEXT_TOKENS)


def stop_words_from_list(rows: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    """TensorRT-LLM's ``stop_words_list`` (``[flat ids, end offsets padded with -1]``, as
    preprocessing writes it) -> one token tuple per stop word."""
    ids, offsets = rows
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            words.append(tuple(ids[start:end]))
        start = end
    return tuple(words)


# Triton datatype -> numpy dtype name (BYTES travel as numpy object arrays of bytes).
NUMPY_DTYPES = {
    "BOOL": "bool",
    "INT32": "int32",
    "INT64": "int64",
    "UINT64": "uint64",
    "FP16": "float16",
    "FP32": "float32",
    "BYTES": "object",
}


@dataclass(frozen=True)
class Tensor:
    """One input or output of a Triton model."""

    name: str
    dtype: str  # Triton datatype as clients name it: "INT32", "FP32", "BYTES", ...
    dims: tuple[int, ...]  # without the batch dimension; -1 = any length
    optional: bool = False
    scalar_reshape: bool = False  # TensorRT-LLM's engine scalars: dims [1], reshape [] in the config
    ragged: bool = False  # allow_ragged_batch (TensorRT-LLM's variable-length engine inputs)
    doc: str = ""

    @property
    def numpy_dtype(self) -> str:
        return NUMPY_DTYPES[self.dtype]

    @property
    def config_dtype(self) -> str:
        """The ``data_type`` of a config.pbtxt: BYTES is ``TYPE_STRING`` there."""
        return "TYPE_STRING" if self.dtype == "BYTES" else f"TYPE_{self.dtype}"

    def with_name(self, name: str) -> Tensor:
        return Tensor(name, self.dtype, self.dims, self.optional, self.scalar_reshape, self.ragged, self.doc)

    def required(self) -> Tensor:
        return Tensor(self.name, self.dtype, self.dims, False, self.scalar_reshape, self.ragged, self.doc)

    def as_optional(self) -> Tensor:
        return Tensor(self.name, self.dtype, self.dims, True, self.scalar_reshape, self.ragged, self.doc)

    def as_plain(self) -> Tensor:
        """This tensor as a python model declares it: same name, dtype and dims, required, neither
        ragged nor reshaped (an engine scalar's ``dims: [1]`` stays ``[1]``)."""
        return Tensor(self.name, self.dtype, self.dims)

    def as_engine_scalar(self) -> Tensor:
        """The engine models' optional input of the same name and dtype: ``dims: [1]`` with
        ``reshape: []``, as TensorRT-LLM's ``tensorrt_llm`` config declares its scalars."""
        return Tensor(self.name, self.dtype, (1,), optional=True, scalar_reshape=True)

    def with_dims(self, dims: tuple[int, ...], doc: str = "") -> Tensor:
        """A plain tensor (see :meth:`as_plain`) of the same name and dtype with other dims."""
        return Tensor(self.name, self.dtype, dims, doc=doc)


def _scalar(name: str, dtype: str, doc: str = "", *, optional: bool = False) -> Tensor:
    return Tensor(name, dtype, (1,), optional=optional, doc=doc)


def _engine_scalar(name: str, dtype: str, *, optional: bool = True) -> Tensor:
    return Tensor(name, dtype, (1,), optional=optional, scalar_reshape=True)


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {tensor.name: tensor for tensor in tensors}


# --- ensemble: the client's interface -----------------------------------------------------------
#
# TensorRT-LLM 1.2.x's own ensemble interface (triton_backend/all_models/inflight_batcher_llm/
# ensemble/config.pbtxt): the same names, dtypes and dims, so its clients (the end-to-end gRPC
# client, Triton's OpenAI frontend, genai-perf --backend tensorrtllm, the HTTP generate endpoint)
# work unchanged; plus ours: num_draft_tokens, adaptive_draft and random_seed (an alias of seed).
# Defaults are TensorRT-LLM's: stream absent = false; neither top_k nor top_p = greedy whatever
# the temperature; exclude_input_in_output absent = the repository's configured default;
# min_tokens absent = 1. Penalties, min_tokens, bad words and the embedding bias are applied to
# draft and target alike (penalties.py). Inputs whose speculative treatment is not implemented
# (logits, LoRA, prompt tables, guided decoding) are declared, and refused by preprocessing unless
# they hold their neutral default (see there).

TEXT_INPUT = _scalar("text_input", "BYTES", "the prompt, UTF-8; [N, 1] = a batch of N prompts")
DECODER_TEXT_INPUT = _scalar("decoder_text_input", "BYTES", "encoder-decoder models only: empty", optional=True)
MAX_TOKENS = _scalar("max_tokens", "INT32", "tokens to generate, >= 1")
NUM_RETURN_SEQUENCES = _scalar("num_return_sequences", "INT32", "1 (one sequence per prompt)", optional=True)
BAD_WORDS = Tensor("bad_words", "BYTES", (-1,), optional=True, doc="strings the completion never contains")
STOP_WORDS = Tensor("stop_words", "BYTES", (-1,), optional=True, doc="strings that end the completion")
REQUEST_EXCLUDE_INPUT_IN_OUTPUT = _scalar(
    "exclude_input_in_output",
    "BOOL",
    "false: text_output = prompt + completion (non-streaming); absent = the repository's default (true)",
    optional=True,
)
REQUEST_END_ID = _scalar("end_id", "INT32", "the token that ends generation; absent = EOS; -1 = none", optional=True)
REQUEST_PAD_ID = _scalar("pad_id", "INT32", "the padding token; absent = the tokenizer's", optional=True)
TOP_K = _scalar("top_k", "INT32", "absent or 0 = no top-k; neither top_k nor top_p = greedy", optional=True)
TOP_P = _scalar("top_p", "FP32", "absent = 1.0; neither top_k nor top_p = greedy", optional=True)
TEMPERATURE = _scalar("temperature", "FP32", "absent = 1.0 when sampling; 0 = greedy", optional=True)
LENGTH_PENALTY = _scalar("length_penalty", "FP32", "not supported yet: 0.0 or 1.0", optional=True)
REPETITION_PENALTY = _scalar("repetition_penalty", "FP32", "> 0; absent = 1.0 (none)", optional=True)
MIN_TOKENS = _scalar("min_tokens", "INT32", "no end_id before this many tokens; absent = 1", optional=True)
PRESENCE_PENALTY = _scalar("presence_penalty", "FP32", "absent = 0.0 (none)", optional=True)
FREQUENCY_PENALTY = _scalar("frequency_penalty", "FP32", "absent = 0.0 (none)", optional=True)
SEED = _scalar("seed", "UINT64", "sampling seed", optional=True)
RETURN_LOG_PROBS = _scalar(
    "return_log_probs", "BOOL", "fill output_log_probs and cum_log_probs (under the target)", optional=True
)
RETURN_CONTEXT_LOGITS = _scalar("return_context_logits", "BOOL", "not supported yet: false", optional=True)
REQUEST_RETURN_GENERATION_LOGITS = _scalar(
    "return_generation_logits", "BOOL", "not supported yet: false", optional=True
)
REQUEST_RETURN_PERF_METRICS = _scalar("return_perf_metrics", "BOOL", "not supported yet: false", optional=True)
RETURN_NUM_INPUT_TOKENS = _scalar("return_num_input_tokens", "BOOL", "fill num_input_tokens", optional=True)
RETURN_NUM_OUTPUT_TOKENS = _scalar(
    "return_num_output_tokens", "BOOL", "num_output_tokens as TensorRT-LLM counts it", optional=True
)
REQUEST_BEAM_WIDTH = _scalar("beam_width", "INT32", "1 (no beam search)", optional=True)
STREAM = _scalar("stream", "BOOL", "absent = false: one response with the whole completion", optional=True)
PROMPT_EMBEDDING_TABLE = Tensor("prompt_embedding_table", "FP16", (-1, -1), optional=True, doc="not supported")
PROMPT_TABLE_EXTRA_ID = _scalar("prompt_table_extra_id", "UINT64", "not supported yet: 0", optional=True)
PROMPT_VOCAB_SIZE = _scalar("prompt_vocab_size", "INT32", "not supported yet: 0", optional=True)
EMBEDDING_BIAS_WORDS = Tensor(
    "embedding_bias_words", "BYTES", (-1,), optional=True, doc="words whose tokens get embedding_bias_weights"
)
EMBEDDING_BIAS_WEIGHTS = Tensor(
    "embedding_bias_weights", "FP32", (-1,), optional=True, doc="one logit bias per embedding_bias_words entry"
)
LORA_TASK_ID = _scalar("lora_task_id", "UINT64", "not supported: omit", optional=True)
LORA_WEIGHTS = Tensor("lora_weights", "FP16", (-1, -1), optional=True, ragged=True, doc="not supported: omit")
LORA_CONFIG = Tensor("lora_config", "INT32", (-1, 3), optional=True, ragged=True, doc="not supported: omit")
GUIDED_DECODING_GUIDE_TYPE = Tensor(
    "guided_decoding_guide_type", "BYTES", (1,), optional=True, ragged=True, doc="not supported yet: empty"
)
GUIDED_DECODING_GUIDE = Tensor(
    "guided_decoding_guide", "BYTES", (1,), optional=True, ragged=True, doc="not supported yet: empty"
)
NUM_DRAFT_TOKENS = _scalar(
    "num_draft_tokens", "INT32", "absent = the spec's K; 0 = plain target decoding", optional=True
)
ADAPTIVE_DRAFT = _scalar(
    "adaptive_draft",
    "BOOL",
    "choose K each step, up to num_draft_tokens; absent = the repository's default",
    optional=True,
)
RANDOM_SEED = _scalar("random_seed", "UINT64", "an alias of seed (older TensorRT-LLM's name)", optional=True)

TEXT_OUTPUT = Tensor("text_output", "BYTES", (-1,), doc="new text (streaming) or the whole completion; shape [1]")
CUM_LOG_PROBS = Tensor("cum_log_probs", "FP32", (-1,), doc="[1]: the sum of output_log_probs (return_log_probs)")
OUTPUT_LOG_PROBS = Tensor(
    "output_log_probs",
    "FP32",
    (-1, -1),
    doc="[1, n]: each token of this response's text under the target (return_log_probs; penalties.py)",
)
CONTEXT_LOGITS = Tensor("context_logits", "FP32", (-1, -1), doc="declared, never filled")
BATCH_INDEX = _scalar("batch_index", "INT32", "the prompt's row in a request of several prompts")
SEQUENCE_INDEX = _scalar("sequence_index", "INT32", "always 0: one sequence per prompt")
ARRIVAL_TIME_NS = _scalar("arrival_time_ns", "INT64", "declared, never filled (return_perf_metrics)")
FIRST_SCHEDULED_TIME_NS = _scalar("first_scheduled_time_ns", "INT64", "declared, never filled")
FIRST_TOKEN_TIME_NS = _scalar("first_token_time_ns", "INT64", "declared, never filled")
LAST_TOKEN_TIME_NS = _scalar("last_token_time_ns", "INT64", "declared, never filled")
TOTAL_DRAFT_TOKENS = _scalar("total_draft_tokens", "INT32", "running total of drafted tokens")
TOTAL_ACCEPTED_DRAFT_TOKENS = _scalar("total_accepted_draft_tokens", "INT32", "running total of accepted drafts")
ACCEPTANCE_RATE = _scalar("acceptance_rate", "FP32", "accepted / drafted so far")
NUM_TARGET_CALLS = _scalar("num_target_calls", "INT32", "running total of target engine calls")
# By source (runtime/methods: SOURCES): the prompt lookup's share of the totals above; the rest of
# them came from the draft model.
TOTAL_LOOKUP_DRAFT_TOKENS = _scalar(
    "total_lookup_draft_tokens", "INT32", "running total of drafted tokens from prompt lookup (the rest: draft model)"
)
TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS = _scalar(
    "total_accepted_lookup_draft_tokens", "INT32", "running total of accepted drafts from prompt lookup"
)
NUM_INPUT_TOKENS = _scalar("num_input_tokens", "INT32", "the prompt's tokens, when return_num_input_tokens")
NUM_OUTPUT_TOKENS = _scalar(
    "num_output_tokens",
    "INT32",
    "running total of generated tokens; with return_num_output_tokens TensorRT-LLM's count: the tokens this "
    "response carries (streaming: the new ones; non-streaming with the prompt included: prompt + completion)",
)

ENSEMBLE_INPUTS = (
    TEXT_INPUT,
    DECODER_TEXT_INPUT,
    MAX_TOKENS,
    NUM_RETURN_SEQUENCES,
    BAD_WORDS,
    STOP_WORDS,
    REQUEST_EXCLUDE_INPUT_IN_OUTPUT,
    REQUEST_END_ID,
    REQUEST_PAD_ID,
    TOP_K,
    TOP_P,
    TEMPERATURE,
    LENGTH_PENALTY,
    REPETITION_PENALTY,
    MIN_TOKENS,
    PRESENCE_PENALTY,
    FREQUENCY_PENALTY,
    SEED,
    RETURN_LOG_PROBS,
    RETURN_CONTEXT_LOGITS,
    REQUEST_RETURN_GENERATION_LOGITS,
    REQUEST_RETURN_PERF_METRICS,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    REQUEST_BEAM_WIDTH,
    STREAM,
    PROMPT_EMBEDDING_TABLE,
    PROMPT_TABLE_EXTRA_ID,
    PROMPT_VOCAB_SIZE,
    EMBEDDING_BIAS_WORDS,
    EMBEDDING_BIAS_WEIGHTS,
    LORA_TASK_ID,
    LORA_WEIGHTS,
    LORA_CONFIG,
    GUIDED_DECODING_GUIDE_TYPE,
    GUIDED_DECODING_GUIDE,
    NUM_DRAFT_TOKENS,
    ADAPTIVE_DRAFT,
    RANDOM_SEED,
)
# Inputs the ensemble hands to the loop model directly (preprocessing neither needs nor checks them).
LOOP_DIRECT_INPUTS = (SEED, RANDOM_SEED, ADAPTIVE_DRAFT)
STATS_OUTPUTS = (
    TOTAL_DRAFT_TOKENS,
    TOTAL_ACCEPTED_DRAFT_TOKENS,
    ACCEPTANCE_RATE,
    NUM_TARGET_CALLS,
    NUM_OUTPUT_TOKENS,
    TOTAL_LOOKUP_DRAFT_TOKENS,
    TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS,
)
# --- engine models: TensorRT-LLM 1.2.x names -----------------------------------------------------
#
# Every input and output of upstream's tensorrt_llm model, with its name, dtype, dims, optional,
# reshape and ragged flags (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt
# @ 0c8de69a1ca6213eebb20a51873890ff128666c2, 1.2.0rc8; its ${...} dtypes as this repository fills
# them: logits FP32, prompt tables and encoder features FP16), except draft_acceptance_threshold.
# What both flavors do with each: docs/trtllm-engine-interface.md; the inputs declared but not
# supported, and their neutral values: runtime/engine_interface.py.

INPUT_IDS = Tensor("input_ids", "INT32", (-1,), ragged=True)
INPUT_LENGTHS = _engine_scalar("input_lengths", "INT32", optional=False)
REQUEST_OUTPUT_LEN = _engine_scalar("request_output_len", "INT32", optional=False)
DRAFT_INPUT_IDS = Tensor("draft_input_ids", "INT32", (-1,), optional=True, ragged=True)
DRAFT_LOGITS = Tensor("draft_logits", "FP32", (-1, -1), optional=True, ragged=True)  # [K, vocab]
END_ID = REQUEST_END_ID.as_engine_scalar()
PAD_ID = REQUEST_PAD_ID.as_engine_scalar()
STOP_WORDS_LIST = Tensor("stop_words_list", "INT32", (2, -1), optional=True, ragged=True)  # [ids; offsets]
BAD_WORDS_LIST = STOP_WORDS_LIST.with_name("bad_words_list")  # the same format
EMBEDDING_BIAS = Tensor("embedding_bias", "FP32", (-1,), optional=True, ragged=True)  # [V] or [0]: none
ENGINE_REPETITION_PENALTY = REPETITION_PENALTY.as_engine_scalar()
ENGINE_PRESENCE_PENALTY = PRESENCE_PENALTY.as_engine_scalar()
ENGINE_FREQUENCY_PENALTY = FREQUENCY_PENALTY.as_engine_scalar()
ENGINE_MIN_TOKENS = MIN_TOKENS.as_engine_scalar()
BEAM_WIDTH = REQUEST_BEAM_WIDTH.as_engine_scalar()
ENGINE_TEMPERATURE = TEMPERATURE.as_engine_scalar()
RUNTIME_TOP_K = _engine_scalar("runtime_top_k", "INT32")
RUNTIME_TOP_P = _engine_scalar("runtime_top_p", "FP32")
ENGINE_SEED = SEED.as_engine_scalar()  # 1.2.x reads "seed" (older backends: "random_seed")
RETURN_GENERATION_LOGITS = REQUEST_RETURN_GENERATION_LOGITS.as_engine_scalar()
RETURN_PERF_METRICS = REQUEST_RETURN_PERF_METRICS.as_engine_scalar()
EXCLUDE_INPUT_IN_OUTPUT = REQUEST_EXCLUDE_INPUT_IN_OUTPUT.as_engine_scalar()
STREAMING = _engine_scalar("streaming", "BOOL")
# Answered by both flavors: output_log_probs and cum_log_probs (not with draft_input_ids), the
# token counts, one sequence per request, context logits refused as an engine built without
# gather_context_logits refuses them, and a stop request (nothing of it is running any more).
ENGINE_RETURN_LOG_PROBS = RETURN_LOG_PROBS.as_engine_scalar()
ENGINE_RETURN_CONTEXT_LOGITS = RETURN_CONTEXT_LOGITS.as_engine_scalar()
ENGINE_RETURN_NUM_INPUT_TOKENS = RETURN_NUM_INPUT_TOKENS.as_engine_scalar()
ENGINE_RETURN_NUM_OUTPUT_TOKENS = RETURN_NUM_OUTPUT_TOKENS.as_engine_scalar()
ENGINE_NUM_RETURN_SEQUENCES = NUM_RETURN_SEQUENCES.as_engine_scalar()
STOP = _engine_scalar("stop", "BOOL")
# Declared and refused unless absent or neutral (engine_interface.py): encoder-decoder and
# multimodal models, decoding modes and adapters the speculative loop does not drive.
ENCODER_INPUT_FEATURES = Tensor("encoder_input_features", "FP16", (-1, -1), optional=True, ragged=True)
ENCODER_OUTPUT_LENGTHS = _engine_scalar("encoder_output_lengths", "INT32")
DECODER_INPUT_IDS = Tensor("decoder_input_ids", "INT32", (-1,), optional=True, ragged=True)
DECODER_INPUT_LENGTHS = _engine_scalar("decoder_input_lengths", "INT32")
RUNTIME_TOP_P_MIN = _engine_scalar("runtime_top_p_min", "FP32")
RUNTIME_TOP_P_DECAY = _engine_scalar("runtime_top_p_decay", "FP32")
RUNTIME_TOP_P_RESET_IDS = _engine_scalar("runtime_top_p_reset_ids", "INT32")
LEN_PENALTY = _engine_scalar("len_penalty", "FP32")
EARLY_STOPPING = _engine_scalar("early_stopping", "BOOL")
BEAM_SEARCH_DIVERSITY_RATE = _engine_scalar("beam_search_diversity_rate", "FP32")
ENGINE_PROMPT_EMBEDDING_TABLE = Tensor("prompt_embedding_table", "FP16", (-1, -1), optional=True, ragged=True)
PROMPT_TABLE_EXTRA_IDS = Tensor("prompt_table_extra_ids", "UINT64", (-1,), optional=True, ragged=True)
ENGINE_PROMPT_VOCAB_SIZE = PROMPT_VOCAB_SIZE.as_engine_scalar()
CROSS_ATTENTION_MASK = Tensor("cross_attention_mask", "BOOL", (-1, -1), optional=True, ragged=True)
MROPE_ROTARY_COS_SIN = Tensor("mrope_rotary_cos_sin", "FP32", (-1,), optional=True)
MROPE_POSITION_DELTAS = Tensor("mrope_position_deltas", "INT64", (1,), optional=True)
ENGINE_LORA_TASK_ID = LORA_TASK_ID.as_engine_scalar()
CONTEXT_PHASE_PARAMS = Tensor("context_phase_params", "UINT8", (-1,), optional=True, ragged=True)
SKIP_CROSS_ATTN_BLOCKS = Tensor("skip_cross_attn_blocks", "BOOL", (1,), optional=True, ragged=True)
RETENTION_TOKEN_RANGE_STARTS = Tensor("retention_token_range_starts", "INT32", (-1,), optional=True, ragged=True)
RETENTION_TOKEN_RANGE_ENDS = RETENTION_TOKEN_RANGE_STARTS.with_name("retention_token_range_ends")
RETENTION_TOKEN_RANGE_PRIORITIES = RETENTION_TOKEN_RANGE_STARTS.with_name("retention_token_range_priorities")
RETENTION_TOKEN_RANGE_DURATIONS_MS = RETENTION_TOKEN_RANGE_STARTS.with_name("retention_token_range_durations_ms")
RETENTION_DECODE_PRIORITY = Tensor("retention_decode_priority", "INT32", (1,), optional=True, ragged=True)
RETENTION_DECODE_DURATION_MS = RETENTION_DECODE_PRIORITY.with_name("retention_decode_duration_ms")
LOOKAHEAD_WINDOW_SIZE = Tensor("lookahead_window_size", "INT32", (1,), optional=True, ragged=True)
LOOKAHEAD_NGRAM_SIZE = LOOKAHEAD_WINDOW_SIZE.with_name("lookahead_ngram_size")
LOOKAHEAD_VERIFICATION_SET_SIZE = LOOKAHEAD_WINDOW_SIZE.with_name("lookahead_verification_set_size")

OUTPUT_IDS = Tensor("output_ids", "INT32", (-1, -1))  # [beam, tokens]
SEQUENCE_LENGTH = Tensor("sequence_length", "INT32", (-1,))  # [beam]
ENGINE_CUM_LOG_PROBS = Tensor("cum_log_probs", "FP32", (-1,))  # [beam]
ENGINE_OUTPUT_LOG_PROBS = Tensor("output_log_probs", "FP32", (-1, -1))  # [beam, generated tokens]
ENGINE_CONTEXT_LOGITS = Tensor("context_logits", "FP32", (-1, -1))  # [prompt tokens, vocab]
GENERATION_LOGITS = Tensor("generation_logits", "FP32", (-1, -1, -1))  # [beam, tokens, vocab]
ENGINE_BATCH_INDEX = Tensor("batch_index", "INT32", (1,))
ENGINE_SEQUENCE_INDEX = Tensor("sequence_index", "INT32", (1,))
CONTEXT_PHASE_PARAMS_OUTPUT = Tensor("context_phase_params", "UINT8", (-1,))
KV_CACHE_REUSED_BLOCKS = Tensor("kv_cache_reused_blocks", "INT32", (1,))
KV_CACHE_ALLOC_NEW_BLOCKS = Tensor("kv_cache_alloc_new_blocks", "INT32", (1,))
KV_CACHE_ALLOC_TOTAL_BLOCKS = Tensor("kv_cache_alloc_total_blocks", "INT32", (1,))
ENGINE_ARRIVAL_TIME_NS = Tensor("arrival_time_ns", "INT64", (1,))
ENGINE_FIRST_SCHEDULED_TIME_NS = Tensor("first_scheduled_time_ns", "INT64", (1,))
ENGINE_FIRST_TOKEN_TIME_NS = Tensor("first_token_time_ns", "INT64", (1,))
ENGINE_LAST_TOKEN_TIME_NS = Tensor("last_token_time_ns", "INT64", (1,))
# Speculative-decoding perf metrics (with return_perf_metrics): per executor request, so for one
# verification call total_draft_tokens is the drafts the target verified after any it discarded.
ENGINE_ACCEPTANCE_RATE = Tensor("acceptance_rate", "FP32", (1,))
ENGINE_TOTAL_ACCEPTED_DRAFT_TOKENS = Tensor("total_accepted_draft_tokens", "INT32", (1,))
ENGINE_TOTAL_DRAFT_TOKENS = Tensor("total_draft_tokens", "INT32", (1,))
ENGINE_NUM_INPUT_TOKENS = Tensor("num_input_tokens", "INT32", (1,))  # [1] with return_num_input_tokens
ENGINE_NUM_OUTPUT_TOKENS = Tensor("num_output_tokens", "INT32", (1,))  # [1]: output_ids' length

# Upstream's order. The target verifies external draft tokens (TensorRT-LLM's
# ExternalDraftTokensConfig); we never declare draft_acceptance_threshold: a threshold makes
# acceptance inexact. The draft takes no drafts.
TARGET_INPUTS = (
    INPUT_IDS,
    ENCODER_INPUT_FEATURES,
    ENCODER_OUTPUT_LENGTHS,
    INPUT_LENGTHS,
    REQUEST_OUTPUT_LEN,
    ENGINE_NUM_RETURN_SEQUENCES,
    DRAFT_INPUT_IDS,
    DECODER_INPUT_IDS,
    DECODER_INPUT_LENGTHS,
    DRAFT_LOGITS,
    END_ID,
    PAD_ID,
    STOP_WORDS_LIST,
    BAD_WORDS_LIST,
    EMBEDDING_BIAS,
    BEAM_WIDTH,
    ENGINE_TEMPERATURE,
    RUNTIME_TOP_K,
    RUNTIME_TOP_P,
    RUNTIME_TOP_P_MIN,
    RUNTIME_TOP_P_DECAY,
    RUNTIME_TOP_P_RESET_IDS,
    LEN_PENALTY,
    EARLY_STOPPING,
    ENGINE_REPETITION_PENALTY,
    ENGINE_MIN_TOKENS,
    BEAM_SEARCH_DIVERSITY_RATE,
    ENGINE_PRESENCE_PENALTY,
    ENGINE_FREQUENCY_PENALTY,
    ENGINE_SEED,
    ENGINE_RETURN_LOG_PROBS,
    ENGINE_RETURN_CONTEXT_LOGITS,
    RETURN_GENERATION_LOGITS,
    RETURN_PERF_METRICS,
    ENGINE_RETURN_NUM_INPUT_TOKENS,
    ENGINE_RETURN_NUM_OUTPUT_TOKENS,
    EXCLUDE_INPUT_IN_OUTPUT,
    STOP,
    STREAMING,
    ENGINE_PROMPT_EMBEDDING_TABLE,
    PROMPT_TABLE_EXTRA_IDS,
    ENGINE_PROMPT_VOCAB_SIZE,
    CROSS_ATTENTION_MASK,
    MROPE_ROTARY_COS_SIN,
    MROPE_POSITION_DELTAS,
    ENGINE_LORA_TASK_ID,
    LORA_WEIGHTS,
    LORA_CONFIG,
    CONTEXT_PHASE_PARAMS,
    SKIP_CROSS_ATTN_BLOCKS,
    RETENTION_TOKEN_RANGE_STARTS,
    RETENTION_TOKEN_RANGE_ENDS,
    RETENTION_TOKEN_RANGE_PRIORITIES,
    RETENTION_TOKEN_RANGE_DURATIONS_MS,
    RETENTION_DECODE_PRIORITY,
    RETENTION_DECODE_DURATION_MS,
    GUIDED_DECODING_GUIDE_TYPE,
    GUIDED_DECODING_GUIDE,
    LOOKAHEAD_WINDOW_SIZE,
    LOOKAHEAD_NGRAM_SIZE,
    LOOKAHEAD_VERIFICATION_SET_SIZE,
)
DRAFT_ENGINE_INPUTS = tuple(tensor for tensor in TARGET_INPUTS if tensor not in (DRAFT_INPUT_IDS, DRAFT_LOGITS))
ENGINE_OUTPUTS = (
    OUTPUT_IDS,
    SEQUENCE_LENGTH,
    ENGINE_CUM_LOG_PROBS,
    ENGINE_OUTPUT_LOG_PROBS,
    ENGINE_CONTEXT_LOGITS,
    GENERATION_LOGITS,
    ENGINE_BATCH_INDEX,
    ENGINE_SEQUENCE_INDEX,
    CONTEXT_PHASE_PARAMS_OUTPUT,
    KV_CACHE_ALLOC_NEW_BLOCKS,
    KV_CACHE_REUSED_BLOCKS,
    KV_CACHE_ALLOC_TOTAL_BLOCKS,
    ENGINE_ARRIVAL_TIME_NS,
    ENGINE_FIRST_SCHEDULED_TIME_NS,
    ENGINE_FIRST_TOKEN_TIME_NS,
    ENGINE_LAST_TOKEN_TIME_NS,
    ENGINE_ACCEPTANCE_RATE,
    ENGINE_TOTAL_ACCEPTED_DRAFT_TOKENS,
    ENGINE_TOTAL_DRAFT_TOKENS,
    ENGINE_NUM_INPUT_TOKENS,
    ENGINE_NUM_OUTPUT_TOKENS,
)
# Declared, never filled by either flavor: context logits (refused), batch_index and
# sequence_index (upstream fills them only for several prompts or sequences in one request, which
# the engine models refuse), context_phase_params (disaggregated serving), the KV-cache and timing
# metrics.
ENGINE_UNFILLED_OUTPUTS = (
    ENGINE_CONTEXT_LOGITS,
    ENGINE_BATCH_INDEX,
    ENGINE_SEQUENCE_INDEX,
    CONTEXT_PHASE_PARAMS_OUTPUT,
    KV_CACHE_ALLOC_NEW_BLOCKS,
    KV_CACHE_REUSED_BLOCKS,
    KV_CACHE_ALLOC_TOTAL_BLOCKS,
    ENGINE_ARRIVAL_TIME_NS,
    ENGINE_FIRST_SCHEDULED_TIME_NS,
    ENGINE_FIRST_TOKEN_TIME_NS,
    ENGINE_LAST_TOKEN_TIME_NS,
)

# TensorRT-LLM's outputs the loop cannot fill (logits, KV-cache and timing metrics): declared and
# mapped, so requesting them is not refused; no response carries them.
UNFILLED_OUTPUTS = (
    CONTEXT_LOGITS,
    GENERATION_LOGITS,
    KV_CACHE_ALLOC_NEW_BLOCKS,
    KV_CACHE_REUSED_BLOCKS,
    KV_CACHE_ALLOC_TOTAL_BLOCKS,
    ARRIVAL_TIME_NS,
    FIRST_SCHEDULED_TIME_NS,
    FIRST_TOKEN_TIME_NS,
    LAST_TOKEN_TIME_NS,
)
# The ensemble's outputs in TensorRT-LLM's order (kv_cache_alloc_total_blocks once, not twice as
# its shipped file has it), then ours.
ENSEMBLE_OUTPUTS = (
    TEXT_OUTPUT,
    CUM_LOG_PROBS,
    OUTPUT_LOG_PROBS,
    CONTEXT_LOGITS,
    GENERATION_LOGITS,
    BATCH_INDEX,
    SEQUENCE_INDEX,
    KV_CACHE_ALLOC_NEW_BLOCKS,
    KV_CACHE_REUSED_BLOCKS,
    KV_CACHE_ALLOC_TOTAL_BLOCKS,
    ARRIVAL_TIME_NS,
    FIRST_SCHEDULED_TIME_NS,
    FIRST_TOKEN_TIME_NS,
    LAST_TOKEN_TIME_NS,
    ACCEPTANCE_RATE,
    TOTAL_ACCEPTED_DRAFT_TOKENS,
    TOTAL_DRAFT_TOKENS,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    NUM_TARGET_CALLS,
    TOTAL_LOOKUP_DRAFT_TOKENS,
    TOTAL_ACCEPTED_LOOKUP_DRAFT_TOKENS,
)
# Every ensemble output but text_output comes straight from the loop model.
LOOP_DIRECT_OUTPUTS = tuple(tensor for tensor in ENSEMBLE_OUTPUTS if tensor is not TEXT_OUTPUT)

# --- tensorrt_llm_bls: the ensemble's pipeline under TensorRT-LLM's BLS interface ----------------
#
# Upstream's tensorrt_llm_bls (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/
# config.pbtxt @ 0193dbd) takes the ensemble's inputs and returns its outputs, plus
# use_draft_logits; here it is a second ensemble over the same three models, so it streams,
# cancels and refuses exactly as `ensemble` does. Unlike upstream's, it decodes speculatively when
# a request sends no num_draft_tokens (the spec's K, as the ensemble): greedy text is the same.
USE_DRAFT_LOGITS = Tensor(
    "use_draft_logits",
    "BOOL",
    (1,),
    optional=True,
    doc="verify sampled drafts with the draft's logits: true only where the engines return logits",
)
BLS_INPUTS = (*ENSEMBLE_INPUTS, USE_DRAFT_LOGITS)

# --- preprocessing: text and parameters in, validated engine-ready tensors out ----------------

PREPROCESSING_INPUTS = (
    *(tensor for tensor in ENSEMBLE_INPUTS if tensor not in LOOP_DIRECT_INPUTS),
    USE_DRAFT_LOGITS,
)
# Resolved per prompt for the loop (not engine inputs of ours): whether to fill num_input_tokens
# and TensorRT-LLM's num_output_tokens.
RESOLVED_RETURN_LOG_PROBS = RETURN_LOG_PROBS.as_plain()
RESOLVED_RETURN_NUM_INPUT_TOKENS = RETURN_NUM_INPUT_TOKENS.as_plain()
RESOLVED_RETURN_NUM_OUTPUT_TOKENS = RETURN_NUM_OUTPUT_TOKENS.as_plain()
# The request sent no num_draft_tokens: its K is the spec's, which the loop lowers to its K schedule
# by requests in flight (LoopParameters.k_schedule); a request that sent one keeps its K.
NUM_DRAFT_TOKENS_IS_DEFAULT = _scalar(
    "num_draft_tokens_is_default", "BOOL", "the request sent no num_draft_tokens (the loop's K schedule applies)"
)
# Every default is resolved here, so the loop's inputs are all present and already checked. The
# engine tensors by their TensorRT-LLM names (stop_words_list in its format; no words = [[0], [-1]]),
# but plain: required, scalars [1], nothing ragged. A request of N prompts gives [N, ...] tensors
# (input_ids right-padded with each prompt's pad_id, stop_words_list padded as TensorRT-LLM pads it).
PREPROCESSING_OUTPUTS = tuple(
    tensor.as_plain()
    for tensor in (
        INPUT_IDS,
        INPUT_LENGTHS,
        REQUEST_OUTPUT_LEN,
        END_ID,
        PAD_ID,
        ENGINE_TEMPERATURE,
        RUNTIME_TOP_K,
        RUNTIME_TOP_P,
        NUM_DRAFT_TOKENS,
        STREAMING,
        STOP_WORDS_LIST,
        BAD_WORDS_LIST,
        EMBEDDING_BIAS,
        ENGINE_REPETITION_PENALTY,
        ENGINE_PRESENCE_PENALTY,
        ENGINE_FREQUENCY_PENALTY,
        ENGINE_MIN_TOKENS,
        EXCLUDE_INPUT_IN_OUTPUT,
        RESOLVED_RETURN_LOG_PROBS,
        RESOLVED_RETURN_NUM_INPUT_TOKENS,
        RESOLVED_RETURN_NUM_OUTPUT_TOKENS,
        NUM_DRAFT_TOKENS_IS_DEFAULT,
    )
)

# --- the loop model ---------------------------------------------------------------------------
#
# Cancellation through the ensemble: Triton marks a cancelled ensemble request's *next* step
# requests as cancelled, never the step already running, so the loop (one long step) would not
# see its client leave. Each loop response therefore carries the request's ``request_key``;
# postprocessing, finding its request cancelled, sends that key back to the loop model in a
# request holding only ``cancel_request_key`` (all loop inputs are optional for this reason),
# and the loop stops before its next engine call. A non-streaming request has no response to
# carry the key until it ends, so while it runs the loop sends *probes* (``is_probe``: an empty
# ``output_ids`` window that is not final) every ``PROBE_INTERVAL_S``; postprocessing answers a
# probe with the final flag only (no client sees it) and relays a cancellation like any response.

PROBE_INTERVAL_S = 0.25


def is_probe(output_ids, is_final) -> bool:
    """A loop response that is a liveness probe: no tokens, not final (arrays with a batch row)."""
    return output_ids.shape[-1] == 0 and not bool(is_final.reshape(-1)[0])


REQUEST_KEY = _scalar("request_key", "UINT64", "the loop's key of the request, to relay a cancellation")
CANCEL_REQUEST_KEY = _scalar("cancel_request_key", "UINT64", "cancel the running request with this key", optional=True)
LOOP_INPUTS = tuple(t.as_optional() for t in (*PREPROCESSING_OUTPUTS, *LOOP_DIRECT_INPUTS, CANCEL_REQUEST_KEY))
NUM_CONTEXT_TOKENS = _scalar("num_context_tokens", "INT32", "leading output_ids earlier responses covered")
IS_FINAL = _scalar("is_final", "BOOL", "the request's last response")
LOOP_OUTPUT_IDS = OUTPUT_IDS.with_dims((-1,), doc="generated[w:n], see the module docstring")
LOOP_OUTPUTS = (LOOP_OUTPUT_IDS, NUM_CONTEXT_TOKENS, IS_FINAL, REQUEST_KEY, *LOOP_DIRECT_OUTPUTS)

# --- postprocessing ---------------------------------------------------------------------------

# Every ensemble output comes from postprocessing: text_output, and the loop's other outputs
# passed through as they came (a response carries those it has). Postprocessing is decoupled so
# that a probe gets no response, and an ensemble may not take its outputs from two decoupled models.
POSTPROCESSING_INPUTS = (
    LOOP_OUTPUT_IDS,
    NUM_CONTEXT_TOKENS,
    IS_FINAL,
    REQUEST_KEY.as_optional(),
    *(tensor.as_optional() for tensor in LOOP_DIRECT_OUTPUTS),
)
POSTPROCESSING_OUTPUTS = (TEXT_OUTPUT, *LOOP_DIRECT_OUTPUTS)

# --- TensorRT-LLM's preprocessing and postprocessing ------------------------------------------------
#
# The interfaces of upstream's models of these names (triton_backend/all_models/inflight_batcher_llm/
# preprocessing/config.pbtxt @ 08dc37e, postprocessing/config.pbtxt @ 89fd9b7), as its clients
# call them one request at a time (e2e_grpc_speculative_decoding_client.py: QUERY -> INPUT_ID ...
# -> the engines -> TOKENS_BATCH -> OUTPUT). Text models only: the image and video inputs are
# declared and refused; the vision outputs are declared and never filled.


def _upper(name: str, dtype: str, dims: tuple[int, ...], doc: str = "", *, optional: bool = True) -> Tensor:
    return Tensor(name, dtype, dims, optional=optional, doc=doc)


def _required(name: str, dtype: str, dims: tuple[int, ...], doc: str = "") -> Tensor:
    return Tensor(name, dtype, dims, doc=doc)


QUERY = _upper("QUERY", "BYTES", (1,), "the prompt, UTF-8", optional=False)
DECODER_QUERY = _upper("DECODER_QUERY", "BYTES", (1,), "encoder-decoder models only: refused")
TRTLLM_REQUEST_OUTPUT_LEN = _upper("REQUEST_OUTPUT_LEN", "INT32", (1,), "tokens to generate", optional=False)
BAD_WORDS_DICT = _upper("BAD_WORDS_DICT", "BYTES", (-1,), "strings the completion never contains")
STOP_WORDS_DICT = _upper("STOP_WORDS_DICT", "BYTES", (-1,), "strings that end the completion")
UPPER_EMBEDDING_BIAS_WORDS = _upper("EMBEDDING_BIAS_WORDS", "BYTES", (-1,), "words to bias")
UPPER_EMBEDDING_BIAS_WEIGHTS = _upper("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,), "one weight per word")
UPPER_END_ID = _upper("END_ID", "INT32", (1,), "absent = the tokenizer's EOS")
UPPER_PAD_ID = _upper("PAD_ID", "INT32", (1,), "absent = the tokenizer's pad token, else EOS")
PROMPT_TABLE_EXTRA_ID_IN = _upper("PROMPT_TABLE_EXTRA_ID", "UINT64", (1,), "p-tuning's KV-reuse id")
VISION_INPUTS = (
    _upper("IMAGE_BYTES", "UINT8", (-1, -1, -1, -1), "multimodal: refused"),
    _upper("IMAGE_URL", "BYTES", (1,), "multimodal: refused"),
    _upper("IMAGES", "BYTES", (-1,), "multimodal: refused"),
    _upper("VIDEO_BYTES", "UINT8", (-1, -1, -1, -1), "multimodal: refused"),
)
TRTLLM_PREPROCESSING_INPUTS = (
    QUERY,
    DECODER_QUERY,
    *VISION_INPUTS,
    TRTLLM_REQUEST_OUTPUT_LEN,
    BAD_WORDS_DICT,
    STOP_WORDS_DICT,
    UPPER_EMBEDDING_BIAS_WORDS,
    UPPER_EMBEDDING_BIAS_WEIGHTS,
    UPPER_END_ID,
    UPPER_PAD_ID,
    PROMPT_TABLE_EXTRA_ID_IN,
)
INPUT_ID = _required("INPUT_ID", "INT32", (-1,), "[N, L]: the prompts' tokens, right-padded with pad ids")
REQUEST_INPUT_LEN = _required("REQUEST_INPUT_LEN", "INT32", (1,), "each prompt's length")
DECODER_INPUT_ID = _required("DECODER_INPUT_ID", "INT32", (-1,), "decoder-only models: [pad_id]")
REQUEST_DECODER_INPUT_LEN = _required("REQUEST_DECODER_INPUT_LEN", "INT32", (1,), "1")
BAD_WORDS_IDS = _required("BAD_WORDS_IDS", "INT32", (2, -1), "bad_words_list's format; [N, 2, 0] = none")
STOP_WORDS_IDS = _required("STOP_WORDS_IDS", "INT32", (2, -1), "stop_words_list's format; [N, 2, 0] = none")
UPPER_EMBEDDING_BIAS = _required("EMBEDDING_BIAS", "FP32", (-1,), "[N, V], or [N, 0] without words")
OUT_REQUEST_OUTPUT_LEN = _required("REQUEST_OUTPUT_LEN", "INT32", (-1,), "REQUEST_OUTPUT_LEN as sent")
OUT_END_ID = _required("OUT_END_ID", "INT32", (1,))
OUT_PAD_ID = _required("OUT_PAD_ID", "INT32", (1,))
OUT_PROMPT_TABLE_EXTRA_IDS = _required("OUT_PROMPT_TABLE_EXTRA_IDS", "UINT64", (-1,), "with PROMPT_TABLE_EXTRA_ID")
VISION_OUTPUTS = (
    _required("PIXEL_VALUES", "FP16", (-1, -1, -1, -1)),
    _required("ASPECT_RATIO_IDS", "INT64", (-1,)),
    _required("ASPECT_RATIO_MASK", "INT64", (-1, -1)),
    _required("CROSS_ATTENTION_MASK", "INT64", (-1, -1, -1)),
    _required("IMAGE_SIZES", "INT64", (-1, 2)),
    _required("IS_VIDEO_INPUT", "BOOL", (1,)),
    _required("ATTENTION_MASK", "INT64", (-1,)),
    _required("IMAGE_GRID_THW", "INT64", (3,)),
    _required("VISION_INPUT_ID", "INT32", (-1,)),
)
TRTLLM_PREPROCESSING_OUTPUTS = (
    INPUT_ID,
    REQUEST_INPUT_LEN,
    DECODER_INPUT_ID,
    REQUEST_DECODER_INPUT_LEN,
    BAD_WORDS_IDS,
    STOP_WORDS_IDS,
    UPPER_EMBEDDING_BIAS,
    OUT_REQUEST_OUTPUT_LEN,
    OUT_END_ID,
    OUT_PAD_ID,
    OUT_PROMPT_TABLE_EXTRA_IDS,
    *VISION_OUTPUTS,
)

TOKENS_BATCH = _required("TOKENS_BATCH", "INT32", (-1, -1), "[N, beams, L]: output_ids")
UPPER_SEQUENCE_LENGTH = _required("SEQUENCE_LENGTH", "INT32", (-1,), "[N, beams]: sequence_length")
OUTPUT = _required("OUTPUT", "BYTES", (-1,), "[N * beams]: each sequence's first SEQUENCE_LENGTH tokens, decoded")
TRTLLM_POSTPROCESSING_INPUTS = (TOKENS_BATCH, UPPER_SEQUENCE_LENGTH)
TRTLLM_POSTPROCESSING_OUTPUTS = (OUTPUT,)
