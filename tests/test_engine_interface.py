"""The engine models ``tensorrt_llm`` / ``tensorrt_llm_draft`` as a drop-in for TensorRT-LLM
1.2.x's own: every input and output of upstream's model declared as upstream declares it, and
answered by both flavors' engine code alike (the PyTorch twin, and the tensorrtllm flavor's
backend emulator): log probs with upstream's semantics, the token counts, one sequence per
request, context logits and the unsupported inputs refused unless neutral, a stop request.

Then end to end through the real CPU Triton server, on both flavors, requests shaped exactly as
TensorRT-LLM's ``inflight_batcher_llm_client.py`` sends them to ``tensorrt_llm``
(NVIDIA/TensorRT-LLM@000a01de66f0eab4ab05640711f0253f50f5209c:triton_backend/inflight_batcher_llm/
client/inflight_batcher_llm_client.py, ``prepare_inputs`` and its ``__main__``): greedy output
equals the target alone and the log probs are the target's.
"""

from __future__ import annotations

import queue

import numpy as np
import pytest
import torch
from conftest import EXAMPLES, greedy_reference, serve_emulated
from test_twin import PROMPT, tiny_llama

from trt_spec.repository import flavors
from trt_spec.runtime import engine_interface
from trt_spec.runtime import tensors as T
from trt_spec.runtime.penalties import ENGINE_DEFAULT_PENALTIES, Penalties, adjusted_scores
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.trtllm_emulator import BackendError, EngineFacts, TrtllmBackendEmulator
from trt_spec.runtime.twin_engine import EngineRequestError, TwinEngine

K = 4
VOCAB = 64  # tiny_llama's
FLAVORS = ("torch", "tensorrtllm")

# Upstream's tensorrt_llm inputs and outputs, read from its config.pbtxt
# (NVIDIA/TensorRT-LLM@0c8de69a1ca6213eebb20a51873890ff128666c2:triton_backend/all_models/
# inflight_batcher_llm/tensorrt_llm/config.pbtxt): name, dtype (its ${...} types as this repository
# fills them), dims, and o = optional, r = reshape [], g = allow_ragged_batch. input_ids is
# optional there (encoder-only models send none); ours requires it. draft_acceptance_threshold is
# left out: we never declare it.
UPSTREAM_INPUTS = """
input_ids INT32 -1 g
encoder_input_features FP16 -1,-1 og
encoder_output_lengths INT32 1 or
input_lengths INT32 1 r
request_output_len INT32 1 r
num_return_sequences INT32 1 or
draft_input_ids INT32 -1 og
decoder_input_ids INT32 -1 og
decoder_input_lengths INT32 1 or
draft_logits FP32 -1,-1 og
end_id INT32 1 or
pad_id INT32 1 or
stop_words_list INT32 2,-1 og
bad_words_list INT32 2,-1 og
embedding_bias FP32 -1 og
beam_width INT32 1 or
temperature FP32 1 or
runtime_top_k INT32 1 or
runtime_top_p FP32 1 or
runtime_top_p_min FP32 1 or
runtime_top_p_decay FP32 1 or
runtime_top_p_reset_ids INT32 1 or
len_penalty FP32 1 or
early_stopping BOOL 1 or
repetition_penalty FP32 1 or
min_tokens INT32 1 or
beam_search_diversity_rate FP32 1 or
presence_penalty FP32 1 or
frequency_penalty FP32 1 or
seed UINT64 1 or
return_log_probs BOOL 1 or
return_context_logits BOOL 1 or
return_generation_logits BOOL 1 or
return_perf_metrics BOOL 1 or
return_num_input_tokens BOOL 1 or
return_num_output_tokens BOOL 1 or
exclude_input_in_output BOOL 1 or
stop BOOL 1 or
streaming BOOL 1 or
prompt_embedding_table FP16 -1,-1 og
prompt_table_extra_ids UINT64 -1 og
prompt_vocab_size INT32 1 or
cross_attention_mask BOOL -1,-1 og
mrope_rotary_cos_sin FP32 -1 o
mrope_position_deltas INT64 1 o
lora_task_id UINT64 1 or
lora_weights FP16 -1,-1 og
lora_config INT32 -1,3 og
context_phase_params UINT8 -1 og
skip_cross_attn_blocks BOOL 1 og
retention_token_range_starts INT32 -1 og
retention_token_range_ends INT32 -1 og
retention_token_range_priorities INT32 -1 og
retention_token_range_durations_ms INT32 -1 og
retention_decode_priority INT32 1 og
retention_decode_duration_ms INT32 1 og
guided_decoding_guide_type STRING 1 og
guided_decoding_guide STRING 1 og
lookahead_window_size INT32 1 og
lookahead_ngram_size INT32 1 og
lookahead_verification_set_size INT32 1 og
"""
UPSTREAM_OUTPUTS = """
output_ids INT32 -1,-1
sequence_length INT32 -1
cum_log_probs FP32 -1
output_log_probs FP32 -1,-1
context_logits FP32 -1,-1
generation_logits FP32 -1,-1,-1
batch_index INT32 1
sequence_index INT32 1
context_phase_params UINT8 -1
kv_cache_alloc_new_blocks INT32 1
kv_cache_reused_blocks INT32 1
kv_cache_alloc_total_blocks INT32 1
arrival_time_ns INT64 1
first_scheduled_time_ns INT64 1
first_token_time_ns INT64 1
last_token_time_ns INT64 1
acceptance_rate FP32 1
total_accepted_draft_tokens INT32 1
total_draft_tokens INT32 1
num_input_tokens INT32 1
num_output_tokens INT32 1
"""


def _declared(table: str) -> list[tuple]:
    """A table above as (name, data_type, dims, optional, reshape, ragged) rows."""
    rows = []
    for line in table.strip().splitlines():
        name, dtype, dims, *flags = line.split()
        flag = flags[0] if flags else ""
        rows.append((name, f"TYPE_{dtype}", [int(d) for d in dims.split(",")], "o" in flag, "r" in flag, "g" in flag))
    return rows


def _rows(tensors) -> list[tuple]:
    from tritonclient.grpc import model_config_pb2

    return [
        (
            t.name,
            model_config_pb2.DataType.Name(t.data_type),
            list(t.dims),
            t.optional,
            t.HasField("reshape") and list(t.reshape.shape) == [],
            t.allow_ragged_batch,
        )
        for t in tensors
    ]


def _output_rows(tensors) -> list[tuple]:
    from tritonclient.grpc import model_config_pb2

    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in tensors]


@pytest.fixture(scope="module")
def settings():
    from trt_spec.plan import make_plan
    from trt_spec.spec import load_spec

    plan = make_plan(load_spec(EXAMPLES / "pystdlib-demo.yaml"))
    return {flavor: flavors.settings_from_plan(plan, flavor=flavor) for flavor in FLAVORS}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_engine_configs_declare_upstreams_inputs_and_outputs(settings, flavor):
    target = flavors.engine_config(settings[flavor], "target")
    draft = flavors.engine_config(settings[flavor], "draft")
    assert _rows(target.input) == _declared(UPSTREAM_INPUTS)
    drafts = {T.DRAFT_INPUT_IDS.name, T.DRAFT_LOGITS.name}
    assert _rows(draft.input) == [row for row in _declared(UPSTREAM_INPUTS) if row[0] not in drafts]
    outputs = [row[:3] for row in _declared(UPSTREAM_OUTPUTS)]
    assert _output_rows(target.output) == outputs and _output_rows(draft.output) == outputs
    parameters = target.parameters["normalize_log_probs"].string_value
    assert parameters == "true"  # upstream's default, written out


# --- both flavors' engine code, without Triton -----------------------------------------------------


class Refused(Exception):
    """An engine's refusal, whichever flavor: str() is the message its client gets."""


class Engine:
    """One flavor's engine model code behind one call: a request's inputs in, its outputs out
    (all of them: the emulator as when a client requests none)."""

    def __init__(self, flavor: str, run):
        self.flavor = flavor
        self._run = run

    def __call__(self, inputs: dict[str, np.ndarray], request_id: str | None = None) -> dict[str, np.ndarray]:
        try:
            return self._run(inputs, request_id)
        except (EngineRequestError, BackendError) as exc:
            raise Refused(str(exc)) from None

    def refusal(self, inputs: dict[str, np.ndarray], request_id: str | None = None) -> str:
        with pytest.raises(Refused) as caught:
            self(inputs, request_id)
        message = str(caught.value)
        assert "\n" not in message
        return message


@pytest.fixture(scope="module")
def model():
    return tiny_llama(2, seed=0)


def make_engine(flavor: str, model, written_configs, role: str = "target", *, normalize: bool = True) -> Engine:
    drafts = K if role == "target" else 0
    if flavor == "torch":
        twin = TwinEngine(
            TorchCausalLM(model),
            role,
            max_draft_len=drafts,
            max_seq_len=120,
            cache_slots=4,
            normalize_log_probs=normalize,
        )
        return Engine(flavor, lambda inputs, request_id: twin.execute(inputs, request_id))
    config = {**written_configs[role], "parameters": dict(written_configs[role]["parameters"])}
    config["parameters"]["normalize_log_probs"] = {"string_value": "true" if normalize else "false"}
    facts = EngineFacts(
        role=role,
        hf_model_dir="tiny-random-llama",
        max_batch_size=4,
        max_input_len=32,
        max_seq_len=64 + drafts,
        max_draft_len=drafts,
        vocab_size=VOCAB,
        gather_generation_logits=True,
    )
    emulator = TrtllmBackendEmulator.load(config, facts, model=TorchCausalLM(model))
    assert emulator.warnings == []
    return Engine(flavor, lambda inputs, request_id: emulator.execute(inputs, [], request_id=request_id))


@pytest.fixture(scope="module", params=FLAVORS)
def engine(request, model, written_configs) -> Engine:
    return make_engine(request.param, model, written_configs)


def scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)  # [batch 1, 1], as the client sends a scalar


def client_request(prompt, output_len: int, **extra) -> dict[str, np.ndarray]:
    """What inflight_batcher_llm_client.py's prepare_inputs always sends, at its defaults (beam
    width 1, temperature 1.0, top-k 1, top-p 0.0, not streaming; end_id -1 as with
    --input-tokens-csv), with --exclude-input-in-output (the engine's default is its config's),
    then ``extra`` (scalars given as (value, dtype))."""
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": scalar(len(prompt), np.int32),
        "request_output_len": scalar(output_len, np.int32),
        "beam_width": scalar(1, np.int32),
        "temperature": scalar(1.0, np.float32),
        "streaming": scalar(False, bool),
        "end_id": scalar(-1, np.int32),
        "pad_id": scalar(0, np.int32),
        "runtime_top_k": scalar(1, np.int32),
        "runtime_top_p": scalar(0.0, np.float32),
        "exclude_input_in_output": scalar(True, bool),
    }
    for name, value in extra.items():
        inputs[name] = value if isinstance(value, np.ndarray) else scalar(*value)
    return inputs


# --return-log-probs -n 1
LOG_PROBS = {"return_log_probs": (True, bool), "num_return_sequences": (1, np.int32)}


def generated(outputs) -> list[int]:
    return outputs["output_ids"][0, 0, : outputs["sequence_length"][0, 0]].tolist()


def runtime_probs(model, prompt, tokens, temperature: float = 1.0, penalties: Penalties | None = None):
    """The probabilities [n, V] each generated token was drawn from: the softmax of the model's
    logits after the engines' adjustments, one full forward pass (no cache)."""
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0, len(prompt) - 1 : -1]
    penalties = Penalties() if penalties is None else penalties
    return adjusted_scores(logits, temperature, penalties, prompt, tokens, None).softmax(-1)


def chosen(probs: torch.Tensor, tokens) -> torch.Tensor:
    return probs[torch.arange(len(tokens)), torch.tensor(tokens)]


def test_greedy_log_probs_are_zero_and_cum_log_probs_the_plain_sum(engine, model):
    # Greedy is top-k 1 to TensorRT-LLM: its one candidate's renormalised log prob is 0.
    outputs = engine(client_request(PROMPT, 8, **LOG_PROBS))
    tokens = generated(outputs)
    probs = runtime_probs(model, PROMPT, tokens)
    assert tokens == probs.argmax(-1).tolist()
    assert outputs["output_log_probs"].dtype == np.float32
    assert outputs["output_log_probs"].tolist() == [[[0.0] * 8]]  # [batch, beams, tokens]
    assert outputs["cum_log_probs"].dtype == np.float32 and outputs["cum_log_probs"].shape == (1, 1)
    assert outputs["cum_log_probs"][0, 0] == pytest.approx(float(chosen(probs, tokens).log().sum()), abs=1e-4)
    for name in ("batch_index", "sequence_index", "context_logits", "num_input_tokens", "num_output_tokens"):
        assert name not in outputs  # one prompt, one sequence, nothing asked


def test_without_normalisation_log_probs_are_the_runtime_logits_log_softmax(model, written_configs):
    # After the embedding bias, the temperature (sent with top-k 1: greedy, yet it scales the log
    # probs) and the repetition penalty, as the penalty layer writes the runtime logits.
    bias = np.zeros((1, VOCAB), dtype=np.float32)
    bias[0, [3, 11]] = [2.0, -1.5]
    extra = {"temperature": (0.5, np.float32), "repetition_penalty": (1.3, np.float32), "embedding_bias": bias}
    penalties = Penalties(repetition_penalty=1.3, embedding_bias=((3, 2.0), (11, -1.5)))
    for flavor in FLAVORS:
        engine = make_engine(flavor, model, written_configs, normalize=False)
        outputs = engine(client_request(PROMPT, 6, **LOG_PROBS, **extra))
        tokens = generated(outputs)
        probs = runtime_probs(model, PROMPT, tokens, 0.5, penalties)
        assert tokens == probs.argmax(-1).tolist(), flavor
        expected = chosen(probs, tokens).log()
        assert np.allclose(outputs["output_log_probs"].reshape(-1), expected.numpy(), atol=1e-4), flavor
        assert outputs["cum_log_probs"][0, 0] == pytest.approx(float(expected.sum()), abs=1e-4)


def test_sampled_log_probs_are_renormalised_over_the_top_k(engine, model):
    sampled = {"temperature": (0.8, np.float32), "runtime_top_k": (5, np.int32), "seed": (3, np.uint64)}
    outputs = engine(client_request(PROMPT, 10, **LOG_PROBS, **sampled))
    tokens = generated(outputs)
    probs = runtime_probs(model, PROMPT, tokens, 0.8)
    top5 = probs.topk(5, dim=-1)
    assert all(token in row for token, row in zip(tokens, top5.indices.tolist()))
    plain = chosen(probs, tokens).log()
    expected = plain - top5.values.sum(-1).log()
    assert (expected < 0).any()  # not all 0: the test can fail
    assert np.allclose(outputs["output_log_probs"].reshape(-1), expected.numpy(), atol=1e-4)
    assert outputs["cum_log_probs"][0, 0] == pytest.approx(float(plain.sum()), abs=1e-4)


def test_top_p_alone_reports_the_plain_log_prob(engine, model):
    sampled = {"temperature": (0.8, np.float32), "runtime_top_k": (0, np.int32), "runtime_top_p": (0.9, np.float32)}
    outputs = engine(client_request(PROMPT, 10, **LOG_PROBS, **sampled, seed=(5, np.uint64)))
    tokens = generated(outputs)
    plain = chosen(runtime_probs(model, PROMPT, tokens, 0.8), tokens).log()
    assert np.allclose(outputs["output_log_probs"].reshape(-1), plain.numpy(), atol=1e-4)
    assert outputs["cum_log_probs"][0, 0] == pytest.approx(float(plain.sum()), abs=1e-4)


def test_only_generated_tokens_have_log_probs_and_the_counts_are_upstreams(engine):
    counts = {"return_num_input_tokens": (True, bool), "return_num_output_tokens": (True, bool)}
    with_prompt = engine(client_request(PROMPT, 5, **LOG_PROBS, **counts, exclude_input_in_output=(False, bool)))
    assert generated(with_prompt)[: len(PROMPT)] == PROMPT and len(generated(with_prompt)) == len(PROMPT) + 5
    assert with_prompt["output_log_probs"].shape == (1, 1, 5)
    assert with_prompt["num_input_tokens"].tolist() == [[len(PROMPT)]]
    assert with_prompt["num_input_tokens"].dtype == np.int32
    assert with_prompt["num_output_tokens"].tolist() == [[len(PROMPT) + 5]]  # every id of output_ids
    excluded = engine(client_request(PROMPT, 5, **counts, exclude_input_in_output=(True, bool)))
    assert excluded["num_output_tokens"].tolist() == [[5]] and excluded["num_input_tokens"].tolist() == [[len(PROMPT)]]
    assert "output_log_probs" not in excluded and "cum_log_probs" not in excluded


def test_the_draft_engine_answers_the_same(model, written_configs):
    for flavor in FLAVORS:
        draft = make_engine(flavor, model, written_configs, "draft")
        counts = {"return_num_input_tokens": (True, bool), "return_num_output_tokens": (True, bool)}
        outputs = draft(client_request(PROMPT, 4, **LOG_PROBS, **counts, exclude_input_in_output=(True, bool)))
        tokens = generated(outputs)
        assert outputs["output_log_probs"].tolist() == [[[0.0] * 4]]
        assert outputs["cum_log_probs"][0, 0] == pytest.approx(
            float(chosen(runtime_probs(model, PROMPT, tokens), tokens).log().sum()), abs=1e-4
        )
        assert outputs["num_output_tokens"].tolist() == [[4]]
        message = draft.refusal(client_request(PROMPT, 2, num_return_sequences=(3, np.int32)))
        assert "num_return_sequences = 3 is not supported by this repository" in message


def test_log_probs_of_a_draft_tokens_request_are_refused(engine):
    drafts = np.array([[7, 8]], dtype=np.int32)
    message = engine.refusal(client_request(PROMPT, 3, **LOG_PROBS, draft_input_ids=drafts))
    assert "return_log_probs with draft_input_ids is not supported by this repository" in message, message
    assert generated(engine(client_request(PROMPT, 3, draft_input_ids=drafts)))  # without log probs: verified


@pytest.mark.parametrize("value", [2, 0])
def test_one_sequence_per_request(engine, value):
    message = engine.refusal(client_request(PROMPT, 2, num_return_sequences=(value, np.int32)))
    assert f"num_return_sequences = {value} is not supported by this repository" in message
    assert "send 1 or omit it" in message


def test_context_logits_are_refused_as_by_an_engine_built_without_them(engine):
    message = engine.refusal(client_request(PROMPT, 2, return_context_logits=(True, bool)))
    assert "gather_context_logits" in message, message
    plain = generated(engine(client_request(PROMPT, 3)))
    assert generated(engine(client_request(PROMPT, 3, return_context_logits=(False, bool)))) == plain


def _array(tensor: T.Tensor, value) -> np.ndarray:
    """``value`` in every element of a [1, ...] tensor of ``tensor``'s dtype and dims (-1 = 1)."""
    shape = (1, *(d if d > 0 else 1 for d in tensor.dims))
    array = np.empty(shape, dtype=T.NUMPY_DTYPES.get(tensor.dtype, tensor.dtype.lower()))
    array.fill(value)
    return array


def _not_neutral(entry: engine_interface.Unsupported):
    if entry.tensor.dtype == "BOOL":
        return not entry.neutral[0] if entry.neutral else True
    return {"BYTES": b"json", "FP16": 0.5, "FP32": 0.5}.get(entry.tensor.dtype, 7)


@pytest.mark.parametrize("entry", engine_interface.UNSUPPORTED_INPUTS, ids=lambda entry: entry.tensor.name)
def test_unsupported_inputs_are_refused_unless_neutral(engine, entry):
    name = entry.tensor.name
    message = engine.refusal(client_request(PROMPT, 1, **{name: _array(entry.tensor, _not_neutral(entry))}))
    assert f"{name} = " in message and "is not supported by this repository" in message, message
    plain = generated(engine(client_request(PROMPT, 2)))
    empty = np.zeros((1, 0), dtype=_array(entry.tensor, 0).dtype)
    assert generated(engine(client_request(PROMPT, 2, **{name: empty}))) == plain
    for value in entry.neutral:
        assert generated(engine(client_request(PROMPT, 2, **{name: _array(entry.tensor, value)}))) == plain


def test_a_stop_request_gets_an_empty_response(engine):
    # prepare_stop_signals: input_ids [1, 1], input_lengths 0, request_output_len 0, stop true.
    stop = {
        "input_ids": np.zeros((1, 1), dtype=np.int32),
        "input_lengths": scalar(0, np.int32),
        "request_output_len": scalar(0, np.int32),
        "stop": scalar(True, bool),
    }
    assert engine(stop, request_id="42") == {}  # the request it names has finished: nothing to stop
    assert engine.refusal(stop, request_id="") == "Trying to stop a request but request ID is not provided"
    assert generated(engine(client_request(PROMPT, 2, stop=(False, bool))))


def test_the_loop_computes_log_probs_itself_and_never_asks_the_engines(model):
    # The engines' log probs of a draft-tokens request are undefined upstream (refused above).
    from test_twin import early_exit_draft
    from test_twin_engine import LocalEngines, loop_inputs, loop_parameters, run, twin_engines

    engines = LocalEngines(*twin_engines((model, early_exit_draft(model))))
    run(engines, loop_inputs(PROMPT, return_log_probs=True), loop_parameters(use_draft_logits=True))
    assert any(T.DRAFT_INPUT_IDS.name in inputs for _, inputs in engines.calls)
    assert not any(T.ENGINE_RETURN_LOG_PROBS.name in inputs for _, inputs in engines.calls)


# --- end to end: inflight_batcher_llm_client.py against tensorrt_llm, on the real Triton server -------

NEW_TOKENS = 16  # the client's --request-output-len default


@pytest.fixture(scope="module", params=FLAVORS)
def server(request, tmp_path_factory):
    """The demo pair's repository in one flavor on the CPU Triton server (the tensorrtllm flavor's
    engine models in the backend emulator), one per flavor for the module."""
    pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
    from trt_spec.repository.writer import write_repository
    from trt_spec.serving.server import TritonServer
    from trt_spec.spec import load_spec

    spec = load_spec(EXAMPLES / "pystdlib-demo.yaml")
    root = tmp_path_factory.mktemp(f"engine_interface_{request.param}")
    if request.param == "torch":
        running = TritonServer(write_repository(spec, root / "repo", "torch").path, ready_timeout_s=300).start()
    else:
        running = serve_emulated(spec, root)
    try:
        yield running
    finally:
        running.stop()


def client_inputs(tokenizer, text: str, **flags) -> list:
    """The InferInputs inflight_batcher_llm_client.py builds for ``--text text`` with a tokenizer
    and ``flags`` (its options: return_log_probs, num_return_sequences, exclude_input_in_output,
    return_num_input_tokens, return_num_output_tokens, top_k, top_p, temperature): its
    ``prepare_inputs``, in its order, with its dtypes and [1, 1] scalars."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import np_to_triton_dtype

    pad_token = tokenizer.pad_token or tokenizer.eos_token  # the client sets pad_token = eos_token
    arrays = {
        "input_ids": np.array([tokenizer.encode(text)], dtype=np.int32),
        "input_lengths": np.array([[len(tokenizer.encode(text))]], dtype=np.int32),
        "request_output_len": np.array([[NEW_TOKENS]], dtype=np.int32),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[flags.get("temperature", 1.0)]], dtype=np.float32),
        "streaming": np.array([[False]], dtype=bool),
        "end_id": np.array([[tokenizer.encode(tokenizer.eos_token, add_special_tokens=False)[0]]], dtype=np.int32),
        "pad_id": np.array([[tokenizer.encode(pad_token, add_special_tokens=False)[0]]], dtype=np.int32),
        "runtime_top_k": np.array([[flags.get("top_k", 1)]], dtype=np.int32),
        "runtime_top_p": np.array([[flags.get("top_p", 0.0)]], dtype=np.float32),
    }
    for name in ("return_num_input_tokens", "return_num_output_tokens"):
        if flags.get(name):
            arrays[name] = np.array([[True]], dtype=bool)
    if flags.get("num_return_sequences"):
        arrays["num_return_sequences"] = np.array([[flags["num_return_sequences"]]], dtype=np.int32)
    if flags.get("return_log_probs"):
        arrays["return_log_probs"] = np.array([[True]], dtype=bool)
    if flags.get("exclude_input_in_output"):
        arrays["exclude_input_in_output"] = np.array([[True]], dtype=bool)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, array.shape, np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def send_as_the_client(server, inputs, *, stream: bool) -> list:
    """With -n (or -S) the client streams (start_stream, async_stream_infer, stop_stream); else
    async_infer with parameters {'Streaming': False}. Returns the results and errors received."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    received: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        if stream:
            client.start_stream(callback=lambda result, error: received.put(error or result))
            client.async_stream_infer(T.TARGET, inputs, outputs=None, request_id="")
            client.stop_stream()
        else:
            client.async_infer(
                T.TARGET,
                inputs,
                callback=lambda result, error: received.put(error or result),
                outputs=None,
                request_id="",
                parameters={"Streaming": False},
            )
            received.put(received.get(timeout=120))  # wait for the one response
    return [received.get() for _ in range(received.qsize())]


def target_probs(target, prompt_ids, tokens):
    """The demo target's runtime probabilities at each generated token: the HF model's logits,
    EOS masked at the first (TensorRT-LLM's min_tokens 1 when a request sends none)."""
    with torch.inference_mode():
        logits = target[0](torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 : -1]
    eos = target[1].eos_token_id
    return adjusted_scores(logits, 1.0, ENGINE_DEFAULT_PENALTIES, prompt_ids, tokens, eos).softmax(-1)


def completion_of(result) -> list[int]:
    """The client's reading with --exclude-input-in-output: output_ids[0][0] up to sequence_length."""
    return result.as_numpy("output_ids")[0][0][: result.as_numpy("sequence_length")[0][0]].tolist()


@pytest.mark.parametrize("text", ["def read_config(path):", "import os\n\n\nclass"])
def test_client_greedy_with_log_probs_and_one_return_sequence(server, target, text):
    # --return-log-probs -n 1 --exclude-input-in-output: the client streams the request.
    tokenizer = target[1]
    prompt_ids = tokenizer.encode(text)
    flags = {"return_log_probs": True, "num_return_sequences": 1, "exclude_input_in_output": True}
    (result,) = send_as_the_client(server, client_inputs(tokenizer, text, **flags), stream=True)
    assert not isinstance(result, Exception), result
    tokens = completion_of(result)
    reference = greedy_reference(target, text, NEW_TOKENS)
    assert tokens[: len(reference)] == reference
    assert tokens[len(reference) :] in ([], [tokenizer.eos_token_id])  # the twin keeps end_id
    assert result.as_numpy("sequence_index") is None  # the client then reads sequence 0
    log_probs = result.as_numpy("output_log_probs")[0]  # the client's set_output(..., [0])
    assert log_probs.shape == (1, len(tokens)) and not log_probs.any()  # greedy: 0.0 (normalised)
    expected = chosen(target_probs(target, prompt_ids, tokens), tokens).log().sum()
    assert result.as_numpy("cum_log_probs")[0].tolist() == pytest.approx([float(expected)], abs=2e-3)


def test_client_sampled_log_probs_and_token_counts(server, target):
    # --return-log-probs --top-k 5 --temperature 0.8 --return-num-input-tokens
    # --return-num-output-tokens --exclude-input-in-output: the client's unary async_infer.
    tokenizer = target[1]
    text = "def main():"
    prompt_ids = tokenizer.encode(text)
    flags = {"return_log_probs": True, "top_k": 5, "temperature": 0.8, "exclude_input_in_output": True}
    flags.update(return_num_input_tokens=True, return_num_output_tokens=True)
    inputs = client_inputs(tokenizer, text, **flags)
    (result,) = send_as_the_client(server, inputs, stream=False)
    assert not isinstance(result, Exception), result
    tokens = completion_of(result)
    assert result.as_numpy("num_input_tokens").tolist() == [[len(prompt_ids)]]
    assert result.as_numpy("num_output_tokens").tolist() == [[len(tokens)]]
    with torch.inference_mode():
        logits = target[0](torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 : -1]
    scores = adjusted_scores(logits, 0.8, ENGINE_DEFAULT_PENALTIES, prompt_ids, tokens, tokenizer.eos_token_id)
    probs = scores.softmax(-1)
    plain = chosen(probs, tokens).log()
    expected = plain - probs.topk(5, dim=-1).values.sum(-1).log()
    assert np.allclose(result.as_numpy("output_log_probs")[0][0], expected.numpy(), atol=2e-3)
    assert result.as_numpy("cum_log_probs")[0][0] == pytest.approx(float(plain.sum()), abs=2e-3)


def test_client_refusals_are_one_line(server, target):
    tokenizer = target[1]
    (error,) = send_as_the_client(server, client_inputs(tokenizer, "x = 1", num_return_sequences=2), stream=True)
    assert isinstance(error, Exception)
    message = error.message()
    assert "num_return_sequences = 2 is not supported by this repository" in message and "\n" not in message
