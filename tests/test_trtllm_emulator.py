"""The TensorRT-LLM 1.2.x backend emulator, without Triton: the load-time rules on the tensorrtllm
configs our writer produces, each request rule with upstream's message, the outputs, decoding, one
external-draft-tokens verification step, and statistical tests of the verification maths (6 sigma
per token with fixed seeds, as tests/test_rejection_sample.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import GUIDED_KEYS
from test_twin import PROMPT, early_exit_draft, reference_greedy, tiny_llama

from trt_spec.runtime.sampling import SamplingParams, probabilities, residual_distribution, sample
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.trtllm_emulator import (
    BackendError,
    EngineFacts,
    TrtllmBackendEmulator,
    accept_by_probability,
    convert_word_list,
)

ROOT = Path(__file__).resolve().parents[1]
DEMO_PAIR = ROOT / "examples" / "pystdlib-pair"
K = 4
VOCAB = 64  # tiny_llama's
OUTPUTS = ["output_ids", "sequence_length"]
LOAD = "unexpected error when creating modelInstanceState: "
ASSERT = "[TensorRT-LLM][ERROR] Assertion failed: "
FETCH = (
    "Executor failed process requestId 1 due to the following error: Encountered an error when fetching new request: "
)
FORWARD = (
    "Executor failed process requestId 1 due to the following error: Encountered an error in forwardAsync function: "
)
SAMPLED = {"temperature": 0.7, "runtime_top_k": 20, "runtime_top_p": 0.9}
STAT_SAMPLING = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)  # SAMPLED, as the maths takes it
STAT_PROMPT = [3, 4, 5, 6]  # where raw draft logits deviate most (about 16 sigma at NUM_TRIALS)
NUM_TRIALS = 4000
SIGMAS = 6.0


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and spin-waiting threads on a shared CPU slow the
    statistical tests tenfold (the repository's engine models also default to one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(2, seed=0)
    return {"target": target, "draft": early_exit_draft(target)}


def facts(role: str, **changes) -> EngineFacts:
    values = dict(
        role=role,
        hf_model_dir="tiny-random-llama",
        max_batch_size=4,
        max_input_len=32,
        max_seq_len=64 + (K if role == "target" else 0),
        max_draft_len=K if role == "target" else 0,
        vocab_size=VOCAB,
        gather_generation_logits=True,
    )
    return EngineFacts(**{**values, **changes})


def with_parameters(config: dict, **values: str | None) -> dict:
    """A copy of ``config`` with parameters set (a str) or removed (None)."""
    config = copy.deepcopy(config)
    for key, value in values.items():
        if value is None:
            config["parameters"].pop(key, None)
        else:
            config["parameters"][key] = {"string_value": value}
    return config


def load(written_configs, models, role="target", config=None, **fact_changes) -> TrtllmBackendEmulator:
    return TrtllmBackendEmulator.load(
        written_configs[role] if config is None else config,
        facts(role, **fact_changes),
        model=TorchCausalLM(models[role]),
    )


def scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)  # [batch 1, 1] as a client sends a scalar


SCALAR_DTYPES = {
    "end_id": np.int32,
    "temperature": np.float32,
    "runtime_top_k": np.int32,
    "runtime_top_p": np.float32,
    "seed": np.uint64,
    "return_generation_logits": bool,
    "exclude_input_in_output": bool,
    "streaming": bool,
    "stop": bool,
    "beam_width": np.int32,
    "draft_acceptance_threshold": np.float32,
}


def request(prompt, output_len, **extra) -> dict[str, np.ndarray]:
    """One request's tensors, each with its batch dimension of 1; the new tokens only, as the loop asks."""
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": scalar(len(prompt), np.int32),
        "request_output_len": scalar(output_len, np.int32),
        "exclude_input_in_output": scalar(True, np.bool_),
    }
    for name, value in extra.items():
        inputs[name] = value if isinstance(value, np.ndarray) else scalar(value, SCALAR_DTYPES[name])
    return inputs


def drafts(tokens) -> np.ndarray:
    return np.array([tokens], dtype=np.int32)


def generated(outputs) -> list[int]:
    assert outputs["output_ids"].dtype == np.int32 and outputs["output_ids"].shape[:2] == (1, 1)
    assert outputs["sequence_length"].shape == (1, 1)
    return outputs["output_ids"][0, 0, : outputs["sequence_length"][0, 0]].tolist()


def raises(message: str, call, *args, **kwargs) -> BackendError:
    with pytest.raises(BackendError) as caught:
        call(*args, **kwargs)
    assert str(caught.value) == message
    return caught.value


# --- load --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["target", "draft"])
def test_the_written_configs_load_without_warnings(written_configs, models, role):
    emulator = load(written_configs, models, role)
    assert emulator.warnings == []
    # The prompt stays in output_ids unless a request says otherwise (the loop always does).
    assert not emulator.config.exclude_input_in_output and emulator.config.enable_kv_cache_reuse
    assert emulator.config.logits_dtype == "FP32" and not emulator.config.decoupled


def test_the_demo_pair_loads_from_its_checkpoint(written_configs):
    target = EngineFacts(
        role="target",
        hf_model_dir=str(DEMO_PAIR / "target"),
        max_batch_size=8,
        max_input_len=512,
        max_seq_len=1012,
        max_draft_len=K,
        vocab_size=4096,
        gather_generation_logits=False,
    )
    emulator = TrtllmBackendEmulator.load(written_configs["target"], target)
    assert generated(emulator.execute(request([1, 2, 3], 3), OUTPUTS)) != []


@pytest.mark.parametrize("missing", ["gpt_model_type", *GUIDED_KEYS])
def test_a_parameter_read_without_default_must_be_there(written_configs, models, missing):
    config = with_parameters(written_configs["target"], **{missing: None})
    error = raises(f"{LOAD}Cannot find parameter with name: {missing}", load, written_configs, models, config=config)
    assert error.stage == "load"


def test_the_guided_decoding_keys_are_read_in_order(written_configs, models):
    config = with_parameters(written_configs["draft"], **{key: None for key in GUIDED_KEYS})
    raises(f"{LOAD}Cannot find parameter with name: tokenizer_dir", load, written_configs, models, "draft", config)


def test_a_config_without_parameters_fails(written_configs, models):
    config = {key: value for key, value in written_configs["target"].items() if key != "parameters"}
    raises(f"{LOAD}Model config doesn't have a parameters section", load, written_configs, models, config=config)


@pytest.mark.parametrize("value", ["inflight_batching", "inflight_fused_batching"])
def test_gpt_model_type_accepted_values(written_configs, models, value):
    load(written_configs, models, config=with_parameters(written_configs["target"], gpt_model_type=value))


@pytest.mark.parametrize("value", ["V1", "v1"])
def test_static_batching_parses_but_the_executor_refuses_it(written_configs, models, value):
    raises(
        f"{LOAD}Static batching type is deprecated. Please use in-flight batching with "
        "CapacitySchedulerPolicy::kSTATIC_BATCH instead.",
        load,
        written_configs,
        models,
        config=with_parameters(written_configs["target"], gpt_model_type=value),
    )


def test_kv_cache_blocks_must_be_onboarded_with_paged_context_fmha(written_configs, models):
    config = with_parameters(written_configs["draft"], kv_cache_onboard_blocks="false")
    message = f"{LOAD}{ASSERT}KV cache blocks need to be onboarded if context FMHA."
    raises(message, load, written_configs, models, "draft", config)


@pytest.mark.parametrize(
    ("fraction", "message"),
    [
        ("0.5", "Do not set crossKvCacheFraction for decoder-only model"),
        ("0", "crossKvCacheFraction > 0.F"),
        ("1.0", "crossKvCacheFraction < 1.F"),
    ],
)
def test_a_cross_kv_cache_fraction_is_refused_on_a_decoder_only_model(written_configs, models, fraction, message):
    config = with_parameters(written_configs["target"], cross_kv_cache_fraction=fraction)
    raises(f"{LOAD}{ASSERT}{message}", load, written_configs, models, config=config)


@pytest.mark.parametrize("value", ["${batching_strategy}", "inflight", ""])
def test_gpt_model_type_other_values_fail(written_configs, models, value):
    config = with_parameters(written_configs["target"], gpt_model_type=value)
    raises(
        f"{LOAD}Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching.",
        load,
        written_configs,
        models,
        config=config,
    )


@pytest.mark.parametrize(
    "text, expected",
    [("True", True), ("true", True), ("TRUE", True), ("1", True)]
    + [("False", False), ("false", False), ("FALSE", False), ("0", False)],
)
def test_boolean_parameters_parse_as_upstream(written_configs, models, text, expected):
    emulator = load(
        written_configs, models, config=with_parameters(written_configs["target"], exclude_input_in_output=text)
    )
    assert emulator.config.exclude_input_in_output is expected and emulator.warnings == []


@pytest.mark.parametrize("text", ["yes", "t", "${exclude_input_in_output}"])
def test_an_unparseable_boolean_falls_back_to_its_default_with_a_warning(written_configs, models, text):
    # Every boolean is read inside try/catch, so "Cannot convert <v> to a boolean." is only logged.
    emulator = load(
        written_configs, models, config=with_parameters(written_configs["target"], exclude_input_in_output=text)
    )
    assert emulator.config.exclude_input_in_output is False  # the default
    assert emulator.warnings == [
        "exclude_input_in_output is not specified, will be set to false "
        f"[exclude_input_in_output={text!r}: Cannot convert {text} to a boolean.]"
    ]


def test_numeric_parameters_parse_as_std_stoi_and_stof(written_configs, models):
    config = with_parameters(
        written_configs["target"],
        max_beam_width="1abc",  # std::stoi reads the leading integer
        kv_cache_free_gpu_mem_fraction="${kv_cache_free_gpu_mem_fraction}",
        max_tokens_in_paged_kv_cache="99999999999",  # out of int32 range
        gpu_weights_percent=" 0.5x",
    )
    emulator = load(written_configs, models, config=config)
    parameters = emulator.config.parameters
    assert parameters["max_beam_width"] == 1 and parameters["gpu_weights_percent"] == 0.5
    assert parameters["kv_cache_free_gpu_mem_fraction"] is None and parameters["max_tokens_in_paged_kv_cache"] is None
    assert emulator.warnings == [
        "max_tokens_in_paged_kv_cache is not specified, will use default value "
        "[max_tokens_in_paged_kv_cache='99999999999': stoi]",
        "kv_cache_free_gpu_mem_fraction is not specified, will use default value of 0.9 or "
        "max_tokens_in_paged_kv_cache [kv_cache_free_gpu_mem_fraction='${kv_cache_free_gpu_mem_fraction}': stof]",
    ]


def test_invalid_string_choices_only_warn(written_configs, models):
    config = with_parameters(written_configs["draft"], batch_scheduler_policy="${policy}", decoding_mode="greedy")
    emulator = load(written_configs, models, "draft", config)
    assert emulator.config.batch_scheduler_policy == "guaranteed_no_evict" and emulator.config.decoding_mode is None
    assert [line.split(" ")[0] for line in emulator.warnings] == ["batch_scheduler_policy", "decoding_mode"]


def test_lookahead_mode_needs_its_parameters(written_configs, models):
    # The one numeric read that upstream does not catch into a default.
    config = with_parameters(written_configs["draft"], decoding_mode="lookahead", lookahead_window_size="4")
    raises(
        f"{LOAD}Decoding mode is set to lookahead but lookahead parameters are not specified. Please set parameters "
        "lookahead_window_size, lookahead_ngram_size, and lookahead_verification_set_size.",
        load,
        written_configs,
        models,
        "draft",
        config,
    )


@pytest.mark.parametrize("path", [None, ""])
def test_an_empty_model_path_fails(written_configs, models, path):
    config = with_parameters(written_configs["target"], gpt_model_path=path)
    raises(
        f"{LOAD}{ASSERT}Both encoder and decoder model paths are empty", load, written_configs, models, config=config
    )


def test_a_model_path_is_not_checked_to_exist(written_configs, models):
    # Not emulated: upstream treats a path that does not exist as empty; a CPU has no engine directory.
    load(written_configs, models, config=with_parameters(written_configs["target"], gpt_model_path="/nonexistent"))


def test_the_target_needs_kv_cache_reuse(written_configs, models):
    config = with_parameters(written_configs["target"], enable_kv_cache_reuse="false")
    raises(
        f"{LOAD}{ASSERT}KV cache block reuse must be enabled for speculative decoding target model",
        load,
        written_configs,
        models,
        config=config,
    )
    load(written_configs, models, "draft", with_parameters(written_configs["draft"], enable_kv_cache_reuse="false"))
    # An unparseable value is the default, true: the target loads (with a warning).
    config = with_parameters(written_configs["target"], enable_kv_cache_reuse="no")
    assert load(written_configs, models, config=config).config.enable_kv_cache_reuse


def test_guided_decoding_parameters(written_configs, models, tmp_path):
    info = tmp_path / "tokenizer_info.json"
    config = with_parameters(
        written_configs["draft"], guided_decoding_backend="xgrammar", xgrammar_tokenizer_info_path=str(info)
    )
    raises(
        f"{LOAD}{ASSERT}Xgrammar's tokenizer info path at {info} does not exist.",
        load,
        written_configs,
        models,
        "draft",
        config,
    )
    info.write_text("{}")
    config = with_parameters(config, guided_decoding_backend="outlines")
    raises(
        f"{LOAD}Guided decoding is currently supported with 'xgrammar' backend. Invalid guided_decoding_backend "
        "parameter provided.",
        load,
        written_configs,
        models,
        "draft",
        config,
    )
    placeholders = {key: "${" + key + "}" for key in GUIDED_KEYS}  # treated as unset
    assert load(written_configs, models, "draft", with_parameters(config, **placeholders)).warnings == []


def test_engine_facts_round_trip_through_json():
    engine = facts("target", logits_dtype="FP16")
    assert EngineFacts.from_json(json.loads(json.dumps(engine.to_json()))) == engine
    with pytest.raises(ValueError, match="unknown keys"):
        EngineFacts.from_json({**engine.to_json(), "tp_size": 1})
    with pytest.raises(ValueError, match="max_draft_len"):
        facts("draft", max_draft_len=K)


# --- per request -------------------------------------------------------------------------------


@pytest.fixture
def target(written_configs, models):
    return load(written_configs, models, "target")


@pytest.fixture
def draft(written_configs, models):
    return load(written_configs, models, "draft")


def test_input_ids_are_required_and_two_dimensional(draft):
    inputs = request(PROMPT, 2)
    del inputs["input_ids"]
    error = raises("inputTokens or encoderInputFeatures tensor not provided", draft.execute, inputs, OUTPUTS)
    assert error.stage == "enqueue"
    inputs = request(PROMPT, 2, input_ids=np.array(PROMPT, dtype=np.int32))
    raises(f"{ASSERT}Expected inputTokens tensors to have 2 dimensions", draft.execute, inputs, OUTPUTS)
    inputs = request(PROMPT, 2, input_ids=np.zeros((1, 0), dtype=np.int32))
    raises(f"{ASSERT}!mInputTokenIds.empty()", draft.execute, inputs, OUTPUTS)


def test_request_output_len_is_required_and_positive(draft):
    inputs = request(PROMPT, 2)
    del inputs["request_output_len"]
    raises("request_output_len is not present in the request", draft.execute, inputs, OUTPUTS)
    raises(f"{ASSERT}mMaxNewTokens > 0", draft.execute, request(PROMPT, 0), OUTPUTS)
    for shape in ([1, 1], [1]):  # Triton's [batch, 1], or [batch] after reshape: []
        inputs = request(PROMPT, 3, request_output_len=np.full(shape, 3, dtype=np.int32))
        assert len(generated(draft.execute(inputs, OUTPUTS))) == 3
    inputs = request(PROMPT, 3, request_output_len=np.full((1, 2), 3, dtype=np.int32))
    raises(f"{ASSERT}Invalid size for tensor request_output_len", draft.execute, inputs, OUTPUTS)


def test_a_batch_of_two_needs_decoupled_mode(draft):
    inputs = request(PROMPT, 2, input_ids=np.array([PROMPT, PROMPT], dtype=np.int32))
    inputs["input_lengths"] = np.array([len(PROMPT)] * 2, dtype=np.int32)
    raises(
        "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy",
        draft.execute,
        inputs,
        OUTPUTS,
    )


def test_streaming_needs_decoupled_mode(draft):
    raises(
        "Streaming is only supported if model is deployed using decoupled mode.",
        draft.execute,
        request(PROMPT, 2, streaming=True),
        OUTPUTS,
    )
    assert generated(draft.execute(request(PROMPT, 2, streaming=False), OUTPUTS))


def test_a_prompt_longer_than_max_input_len_fails(draft):
    error = raises(
        f"{FETCH}Prompt length (33) exceeds maximum input length (32). Set log level to info and check TRTGptModel "
        "logs for how maximum input length is set",
        draft.execute,
        request(list(range(33)), 2),
        OUTPUTS,
    )
    assert error.stage == "executor"


def test_output_beyond_max_seq_len_is_clamped_not_refused(draft, target):
    prompt = list(range(30))
    assert len(generated(draft.execute(request(prompt, 100), OUTPUTS))) == 64 - 30
    assert draft.warnings == [
        "Prompt length + number of requested output tokens + draft tokens per step (30 + 100 + 0) exceeds maximum "
        "sequence length (64). Number of requested output tokens is changed to (34)."
    ]
    # The target's max_draft_len counts even when a request sends no drafts.
    assert len(generated(target.execute(request(prompt, 100), OUTPUTS))) == 68 - 30 - K


def test_end_id_stops_and_is_left_out_and_absent_never_stops(draft, models):
    reference, _ = reference_greedy(models["draft"], PROMPT, 12)
    end_id = reference[5]
    first = reference.index(end_id)
    assert generated(draft.execute(request(PROMPT, 12, end_id=end_id), OUTPUTS)) == reference[:first]
    assert generated(draft.execute(request(PROMPT, 12), OUTPUTS)) == reference  # no end_id: never stops
    raises(
        f"Executor failed process requestId 3 due to the following error: Encountered an error when fetching new "
        f"request: {ASSERT}EndId (64) is not within acceptable range [-1, 64).",
        draft.execute,
        request(PROMPT, 2, end_id=VOCAB),
        OUTPUTS,
    )


def test_exclude_input_in_output_per_request_overrides_the_parameter(written_configs, models, draft):
    assert len(generated(draft.execute(request(PROMPT, 3), OUTPUTS))) == 3  # the request's true
    absent = request(PROMPT, 3)
    del absent["exclude_input_in_output"]
    with_input = generated(draft.execute(absent, OUTPUTS))  # the config's false
    assert with_input[: len(PROMPT)] == PROMPT and len(with_input) == len(PROMPT) + 3
    config = with_parameters(written_configs["draft"], exclude_input_in_output="true")
    emulator = load(written_configs, models, "draft", config)
    assert len(generated(emulator.execute(absent, OUTPUTS))) == 3
    assert len(generated(emulator.execute(request(PROMPT, 3, exclude_input_in_output=True), OUTPUTS))) == 3


def stop_words_list(*words) -> np.ndarray:
    ids = [token for word in words for token in word]
    offsets = list(np.cumsum([len(word) for word in words]))
    offsets += [-1] * (len(ids) - len(offsets))
    return np.array([[ids, offsets]], dtype=np.int32)  # [batch 1, 2, L]


def test_stop_words_end_the_output_and_stay_in_it(draft, models):
    reference, _ = reference_greedy(models["draft"], PROMPT, 12)
    word = reference[3:5]
    end = next(i for i in range(2, 13) if reference[i - 2 : i] == word)
    outputs = draft.execute(request(PROMPT, 12, stop_words_list=stop_words_list([63, 62, 61], word)), OUTPUTS)
    assert generated(outputs) == reference[:end]


@pytest.mark.parametrize(
    "sparse, message",
    [
        ([5, 7, 1], "Sparse list must not have odd length: 5 7 1 "),
        ([5, 7, 9, 1, -1, 3], "Sparse list must not have additional -1s: 5 7 9 1 -1 3 "),
        ([5, 7, 9, 1, 4, -1], "Sparse list must not have out-of-bound offsets: 5 7 9 1 4 -1 "),
        ([5, 7, 9, 2, 1, -1], "Sparse list must not have non-increasing offsets: 5 7 9 2 1 -1 "),
    ],
)
def test_stop_words_list_format_errors(draft, sparse, message):
    inputs = request(PROMPT, 2, stop_words_list=np.array([[sparse]], dtype=np.int32))
    raises(f"{ASSERT}{message}", draft.execute, inputs, OUTPUTS)


def test_convert_word_list():
    assert convert_word_list([5, 7, 9, 1, 3, -1]) == [[5], [7, 9]]
    assert convert_word_list([0, -1]) == []  # the "no words" list preprocessing sends


def test_more_drafts_than_max_draft_len_fail(target, draft):
    message = f"{FETCH}Draft tokens length (5) exceeds maximum draft tokens length (4)."
    raises(message, target.execute, request(PROMPT, 6, draft_input_ids=drafts([1] * 5)), OUTPUTS)
    message = f"{FETCH}Draft tokens length (1) exceeds maximum draft tokens length (0)."
    raises(message, draft.execute, request(PROMPT, 2, draft_input_ids=drafts([1])), OUTPUTS)


@pytest.mark.parametrize(
    "shape, dtype, message",
    [
        ((1, 2, VOCAB), np.float32, f"Incompatible buffer sizes: {2 * VOCAB * 4} != {3 * VOCAB * 4}"),
        ((1, 3, VOCAB + 1), np.float32, f"Incompatible buffer sizes: {3 * (VOCAB + 1) * 4} != {3 * VOCAB * 4}"),
        ((1, 3, VOCAB), np.float16, "Incompatible data types: half != float"),
    ],
)
def test_draft_logits_must_be_k_by_vocab_in_the_engine_dtype(target, shape, dtype, message):
    inputs = request(PROMPT, 4, draft_input_ids=drafts([1, 2, 3]), draft_logits=np.zeros(shape, dtype=dtype))
    assert raises(f"{FORWARD}{ASSERT}{message}", target.execute, inputs, OUTPUTS).stage == "executor"


def test_draft_logits_dtype_follows_an_fp16_engine(written_configs, models):
    emulator = load(written_configs, models, "target", logits_dtype="FP16")
    inputs = request(PROMPT, 4, draft_input_ids=drafts([1, 2]), draft_logits=np.zeros((1, 2, VOCAB), np.float32))
    raises(f"{FORWARD}{ASSERT}Incompatible data types: float != half", emulator.execute, inputs, OUTPUTS)
    inputs["draft_logits"] = inputs["draft_logits"].astype(np.float16)
    assert 1 <= len(generated(emulator.execute(inputs, OUTPUTS))) <= 3


def test_stop_input_cancels_with_an_empty_response(draft):
    assert draft.execute(request(PROMPT, 2, stop=True), OUTPUTS) == {}
    assert draft.execute(request(PROMPT, 2, stop=True), OUTPUTS, request_id="7") == {}
    raises(
        "Trying to stop a request but request ID is not provided",
        draft.execute,
        request(PROMPT, 2, stop=True),
        OUTPUTS,
        request_id="",
    )


@pytest.mark.parametrize(
    "sampling",
    [
        {},
        {"temperature": 5.0},
        {"runtime_top_k": 0},
        {"runtime_top_p": 0.0, "temperature": 2.0},
        {"runtime_top_p": -1.0},
        {"runtime_top_k": 1, "temperature": 3.0},
        {"runtime_top_k": 5, "temperature": 0.0},
    ],
)
def test_greedy_unless_top_k_or_top_p_is_sent(draft, models, sampling):
    reference, _ = reference_greedy(models["draft"], PROMPT, 10)
    assert generated(draft.execute(request(PROMPT, 10, **sampling), OUTPUTS)) == reference


@pytest.mark.parametrize(
    "sampling, check",
    [
        ({"runtime_top_p": 1.5}, "topP.value() <= 1.f"),
        ({"runtime_top_k": -1}, "topK.value() >= 0"),
        ({"temperature": -1.0, "runtime_top_k": 5}, "temperature.value() >= 0.f"),
    ],
)
def test_sampling_values_are_checked(draft, sampling, check):
    raises(f"{ASSERT}{check}", draft.execute, request(PROMPT, 2, **sampling), OUTPUTS)


def test_seed_repeats_randomness_and_defaults_to_zero(draft):
    def run(**seed):
        return generated(draft.execute(request(PROMPT, 12, temperature=1.5, runtime_top_p=1.0, **seed), OUTPUTS))

    assert run(seed=7) == run(seed=7)
    assert run(seed=7) != run(seed=8)
    assert run() == run(seed=0)
    assert run(seed=2**64 - 1) == run(seed=2**64 - 1)


def test_top_k_above_the_kernel_maximum_is_clipped(draft):
    clipped = generated(draft.execute(request(PROMPT, 8, runtime_top_k=5000, temperature=1.5, seed=4), OUTPUTS))
    assert draft.warnings == ["TopK (5000) is larger than max supported number (1024). Clip to max supported number."]
    assert clipped == generated(draft.execute(request(PROMPT, 8, runtime_top_k=1024, temperature=1.5, seed=4), OUTPUTS))


def test_input_lengths_is_not_read_for_one_sequence(draft, models):
    reference, _ = reference_greedy(models["draft"], PROMPT, 4)
    inputs = request(PROMPT, 4, input_lengths=scalar(3, np.int32))  # all of input_ids is the prompt
    assert generated(draft.execute(inputs, OUTPUTS)) == reference


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": np.array([[0.5]], dtype=np.float64)},  # the backend would misread its buffer
        {"len_penalty": np.array([[1.2]], dtype=np.float32)},  # beam search only, not emulated
        {"beam_width": np.array([[2]], dtype=np.int32)},
    ],
)
def test_what_the_emulator_cannot_reproduce_is_refused(draft, extra):
    with pytest.raises(BackendError, match="TensorRT-LLM backend emulator") as caught:
        draft.execute(request(PROMPT, 2, **extra), OUTPUTS)
    assert caught.value.stage == "emulator"


# --- outputs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["output_ids", "sequence_length"])
def test_output_ids_and_sequence_length_must_both_be_requested(draft, missing):
    requested = [name for name in OUTPUTS if name != missing] + ["generation_logits"]
    error = raises(
        f"Error encountered while populating response: {missing} tensor must be present in list of output tensors",
        draft.execute,
        request(PROMPT, 2),
        requested,
    )
    assert error.stage == "response"


def test_no_requested_outputs_means_all(draft):
    outputs = draft.execute(request(PROMPT, 3, return_generation_logits=True), [])
    assert sorted(outputs) == ["generation_logits", "output_ids", "sequence_length"]


def test_generation_logits_are_the_raw_logits_when_asked_for(draft, models):
    reference, reference_logits = reference_greedy(models["draft"], PROMPT, 3)
    outputs = draft.execute(request(PROMPT, 3, return_generation_logits=True), [*OUTPUTS, "generation_logits"])
    assert generated(outputs) == reference
    logits = outputs["generation_logits"]
    assert logits.shape == (1, 1, 3, VOCAB) and logits.dtype == np.float32
    assert torch.allclose(torch.from_numpy(logits[0, 0]), torch.stack(reference_logits), atol=1e-4)
    assert "generation_logits" not in draft.execute(request(PROMPT, 3, return_generation_logits=True), OUTPUTS)
    assert "generation_logits" not in draft.execute(request(PROMPT, 3), [*OUTPUTS, "generation_logits"])


def test_a_verification_returns_one_logits_row_per_token_added(target, models):
    reference, _ = reference_greedy(models["target"], PROMPT, K + 1)
    wanted = [*OUTPUTS, "generation_logits"]
    inputs = request(PROMPT, K + 1, draft_input_ids=drafts(reference[:K]), return_generation_logits=True)
    assert target.execute(inputs, wanted)["generation_logits"].shape == (1, 1, K + 1, VOCAB)
    at_eos = dict(inputs, end_id=scalar(reference[2], np.int32))  # two accepted, then end_id
    assert target.execute(at_eos, wanted)["generation_logits"].shape == (1, 1, 2, VOCAB)
    first = dict(inputs, end_id=scalar(reference[0], np.int32), min_tokens=scalar(0, np.int32))
    outputs = target.execute(first, wanted)  # end_id first: nothing added, no rows
    assert generated(outputs) == [] and outputs["generation_logits"].shape == (1, 1, 0, VOCAB)


def test_perf_metrics_count_the_drafts_verified(target, models):
    reference, _ = reference_greedy(models["target"], PROMPT, K + 1)
    names = [*OUTPUTS, "total_draft_tokens", "total_accepted_draft_tokens", "acceptance_rate"]
    wrong = reference[:2] + [(reference[2] + 1) % VOCAB, reference[3]]
    inputs = request(PROMPT, 1, draft_input_ids=drafts(wrong))
    inputs["return_perf_metrics"] = scalar(True, bool)
    outputs = target.execute(inputs, names)
    assert generated(outputs) == reference[:3]
    assert [outputs[name].reshape(-1)[0].item() for name in names[2:]] == [K, 2, pytest.approx(0.5)]
    del inputs["return_perf_metrics"]
    assert set(target.execute(inputs, names)) == set(OUTPUTS)  # asked for, but not sent without the flag


def test_generation_logits_need_an_engine_that_gathers_them(written_configs, models):
    emulator = load(written_configs, models, "draft", gather_generation_logits=False)
    raises(
        f"{FETCH}{ASSERT}To return generation logits, gather_generation_logits must be enabled in ExecutorConfig",
        emulator.execute,
        request(PROMPT, 2, return_generation_logits=True),
        OUTPUTS,
    )


def test_the_config_logits_dtype_must_match_the_engine(written_configs, models):
    emulator = load(written_configs, models, "draft", logits_dtype="FP16")  # the config declares TYPE_FP32
    raises(
        f"Error encountered while populating response: {ASSERT}generationLogitsType == "
        "model_state_->getLogitsDataType()",
        emulator.execute,
        request(PROMPT, 2, return_generation_logits=True),
        [*OUTPUTS, "generation_logits"],
    )
    assert generated(emulator.execute(request(PROMPT, 2, return_generation_logits=True), OUTPUTS))


# --- decoding and verification -----------------------------------------------------------------


def test_greedy_decoding_matches_the_model_alone(target, models):
    reference, _ = reference_greedy(models["target"], PROMPT, 16)
    assert generated(target.execute(request(PROMPT, 16), OUTPUTS)) == reference


def test_a_draft_tokens_request_is_one_step_whatever_request_output_len(target, models):
    reference, reference_logits = reference_greedy(models["target"], PROMPT, K + 1)
    for output_len in (1, K + 1, 30):
        inputs = request(PROMPT, output_len, draft_input_ids=drafts(reference[:K]))
        assert generated(target.execute(inputs, OUTPUTS)) == reference  # K accepted + the bonus
    wrong = reference[:2] + [(reference[2] + 1) % VOCAB, reference[3]]
    assert generated(target.execute(request(PROMPT, 1, draft_input_ids=drafts(wrong)), OUTPUTS)) == reference[:3]
    inputs = request(PROMPT, 1, draft_input_ids=drafts(reference[:K]), end_id=reference[2])
    assert generated(target.execute(inputs, OUTPUTS)) == reference[:2]  # end_id among the accepted
    # Empty draft_input_ids: plain decoding up to request_output_len.
    six, _ = reference_greedy(models["target"], PROMPT, 6)
    assert generated(target.execute(request(PROMPT, 6, draft_input_ids=drafts([])), OUTPUTS)) == six


def test_drafts_beyond_max_input_len_are_truncated(target, models):
    prompt = list(range(30))  # max_input_len 32: two of the four drafts fit
    reference, _ = reference_greedy(models["target"], prompt, K)
    output = generated(target.execute(request(prompt, 1, draft_input_ids=drafts(reference[:K])), OUTPUTS))
    assert output == reference[:3]  # two accepted + one: one step over the drafts kept
    assert target.warnings[0] == (
        "Prompt length + number of draft tokens (30 + 4) exceeds maximum input length (32).Number of draft tokens "
        "is changed to (2)"
    )
    # The draft logits are not truncated with them: the decoder's copy refuses them (inferred upstream).
    inputs = request(prompt, 1, draft_input_ids=drafts(reference[:K]), draft_logits=np.zeros((1, K, VOCAB), np.float32))
    message = f"Incompatible buffer sizes: {K * VOCAB * 4} != {2 * VOCAB * 4}"
    raises(f"{FORWARD.replace('requestId 1', 'requestId 2')}{ASSERT}{message}", target.execute, inputs, OUTPUTS)


def test_a_constant_acceptance_threshold(target, models):
    reference, _ = reference_greedy(models["target"], PROMPT, K + 1)
    sampled = dict(SAMPLED, seed=3, draft_input_ids=drafts(reference[:K]))
    one_hot = np.full((1, K, VOCAB), -np.inf, dtype=np.float32)
    one_hot[0, np.arange(K), reference[:K]] = 0.0  # q = 1 on each draft
    accept_all = request(PROMPT, 1, draft_logits=one_hot, draft_acceptance_threshold=0.0, **sampled)
    assert generated(target.execute(accept_all, OUTPUTS))[:K] == reference[:K]  # p(d) > 0 * q(d)
    reject_all = request(PROMPT, 1, draft_logits=one_hot, draft_acceptance_threshold=1.0, **sampled)
    output = generated(target.execute(reject_all, OUTPUTS))  # p(d) > 1 * 1 never holds
    assert len(output) == 1 and output[0] != reference[0]  # drawn from norm(max(0, p - q))


def test_kv_cache_reuse_gives_the_same_tokens(target, written_configs, models):
    reference, _ = reference_greedy(models["target"], PROMPT, 10)
    target.execute(request(PROMPT, 1, draft_input_ids=drafts(reference[:K])), OUTPUTS)
    sequence = PROMPT + reference[: K + 1]
    engine = target.pool.engine_for(sequence)
    assert engine.cached_tokens[: len(PROMPT) + K] == PROMPT + reference[:K]  # reused, not recomputed
    assert generated(target.execute(request(sequence, 5), OUTPUTS)) == reference[K + 1 :]


def test_accept_by_probability_accepts_a_zero_q_draft_when_p_is_positive():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    assert accept_by_probability([1], q, p, generator=torch.Generator().manual_seed(0)) == [1, 2]


# --- statistics: the first emitted token's distribution ----------------------------------------


def processed(model, prompt):
    """A model's processed distribution p = softmax(mask_topk_topp(logits / T)) after ``prompt`` at
    SAMPLED's settings, and its raw logits."""
    logits = TorchCausalLM(model).logits(prompt, 1)  # [1, V]
    return probabilities(logits, STAT_SAMPLING)[0], logits[0]


def first_tokens(emulator, draft_probs, draft_logits=None, fixed_draft=None) -> torch.Tensor:
    """Counts of the first token over NUM_TRIALS one-draft verification steps (a fresh seed each)."""
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    for trial in range(NUM_TRIALS):
        token = fixed_draft if fixed_draft is not None else int(sample(draft_probs[None], generator))
        extra = {} if draft_logits is None else {"draft_logits": draft_logits.numpy()[None, None]}
        inputs = request(STAT_PROMPT, 2, draft_input_ids=drafts([token]), seed=trial, **SAMPLED, **extra)
        counts[generated(emulator.execute(inputs, OUTPUTS))[0]] += 1
    return counts


def worst_sigma(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest |count - N p| in standard deviations over the tokens; a token with p = 0 that
    occurs counts as infinitely far."""
    expected = expected.double()
    sigma = (NUM_TRIALS * expected * (1 - expected)).sqrt()
    if (counts[expected == 0] > 0).any():
        return float("inf")
    return float(((counts - NUM_TRIALS * expected).abs() / sigma.clamp_min(1e-12))[expected > 0].max())


def test_processed_draft_logits_give_the_target_distribution(target, models):
    p, _ = processed(models["target"], STAT_PROMPT)
    q, _ = processed(models["draft"], STAT_PROMPT)
    counts = first_tokens(target, q, draft_logits=q.log())  # log of the draft's processed distribution
    assert worst_sigma(counts, p) < SIGMAS


def test_raw_draft_logits_deviate_when_the_draft_sampled_at_temperature_0_7(target, models):
    p, _ = processed(models["target"], STAT_PROMPT)
    q, raw = processed(models["draft"], STAT_PROMPT)
    # What the kernel computes with q_raw = softmax(raw) in place of the q the drafts came from.
    q_raw = raw.softmax(-1).double()
    accept = torch.minimum(torch.ones_like(q_raw), p.double() / q_raw)
    rejected = (q.double() * (1 - accept)).sum()
    expected = q.double() * accept + rejected * residual_distribution(p.double(), q_raw)
    counts = first_tokens(target, q, draft_logits=raw)
    assert worst_sigma(counts, expected) < SIGMAS  # the emulator computes exactly that
    assert worst_sigma(counts, p) > 2 * SIGMAS  # which is measurably not the target's distribution


def test_token_matching_without_draft_logits_resamples_after_a_rejection(target, models):
    p, _ = processed(models["target"], STAT_PROMPT)
    token = int(p.argmax())
    # t ~ p accepted iff t == d, else a fresh draw from p: P(d) = p(d)(2 - p(d)), the rest (1 - p(d)) p.
    expected = (1 - p[token]) * p.double()
    expected[token] = p[token] * (2 - p[token])
    counts = first_tokens(target, None, fixed_draft=token)
    assert worst_sigma(counts, expected) < SIGMAS
