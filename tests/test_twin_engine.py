"""The torch flavor's engine models and the loop model's async driver, without Triton: the twin
engines speak TensorRT-LLM's tensor interface, the prefix-keyed cache pool reuses KV caches, and
the async driver over them emits exactly what the synchronous in-process loop emits."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from test_twin import PROMPT, VOCAB, early_exit_draft, reference_greedy, tiny_llama

from trt_spec.errors import GenerationParamsError
from trt_spec.runtime import bls
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import DEFAULT_STEP_COSTS
from trt_spec.runtime.loop import Generation, GenerationParams
from trt_spec.runtime.parameters import LoopParameters, ModelParametersError
from trt_spec.runtime.prefix_cache import PrefixCachePool
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.twin_engine import (
    EngineRequestError,
    TwinEngine,
    sampling_from_inputs,
    stop_sequences_from_list,
)
from trt_spec.twin import TorchDrafter, TorchVerifier

K = 4
NEW_TOKENS = 20


def loop_parameters(
    max_draft_len: int = K, *, use_draft_logits: bool = False, adaptive_draft: bool = False
) -> LoopParameters:
    """The loop model's config parameters, as the repository writes them."""
    return LoopParameters(
        target_model=T.TARGET,
        draft_model=T.DRAFT,
        max_draft_len=max_draft_len,
        adaptive_draft=adaptive_draft,
        use_draft_logits=use_draft_logits,
        draft_cost=DEFAULT_STEP_COSTS.draft,  # the in-process loop's default: the same K sequence
        verify_slope=DEFAULT_STEP_COSTS.verify_slope,
        vocab_size=VOCAB,
    )


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(2, seed=0)
    return target, early_exit_draft(target)


def twin_engines(models, cache_slots: int = 4):
    target, draft = models
    return (
        TwinEngine(TorchCausalLM(target), "target", max_draft_len=K, max_seq_len=120, cache_slots=cache_slots),
        TwinEngine(TorchCausalLM(draft), "draft", max_draft_len=K, max_seq_len=120, cache_slots=cache_slots),
    )


class LocalEngines:
    """bls.EngineClient over in-process twin engines (what BLS does over Triton)."""

    def __init__(self, target: TwinEngine, draft: TwinEngine):
        self.engines = {T.TARGET: target, T.DRAFT: draft}
        self.calls: list[tuple[str, dict]] = []

    async def infer(self, model, inputs, outputs):
        self.calls.append((model, dict(inputs)))
        await asyncio.sleep(0)  # let other requests interleave, as the Triton driver does
        try:
            result = self.engines[model].execute(inputs)
        except EngineRequestError as exc:
            raise bls.EngineCallError(f"{model}: {exc}") from None
        return {name: array for name, array in result.items() if name in outputs}


def loop_inputs(
    prompt,
    max_tokens=NEW_TOKENS,
    k=K,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    stream=True,
    end_id=1,
    stop_words=None,
    adaptive=None,
    min_tokens=0,
    return_log_probs=False,
) -> dict[str, np.ndarray]:
    """What preprocessing hands the loop model (batch dimension 1); no penalties."""
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[0]], dtype=np.int32),
        "temperature": np.array([[temperature]], dtype=np.float32),
        "runtime_top_k": np.array([[top_k]], dtype=np.int32),
        "runtime_top_p": np.array([[top_p]], dtype=np.float32),
        "num_draft_tokens": np.array([[k]], dtype=np.int32),
        "streaming": np.array([[stream]], dtype=bool),
        "stop_words_list": np.array([stop_words if stop_words is not None else [[0], [-1]]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=bool),
        "return_num_input_tokens": np.array([[False]], dtype=bool),
        "return_num_output_tokens": np.array([[False]], dtype=bool),
        "bad_words_list": np.array([[[0], [-1]]], dtype=np.int32),
        "embedding_bias": np.zeros((1, 0), dtype=np.float32),
        "repetition_penalty": np.array([[1.0]], dtype=np.float32),
        "presence_penalty": np.array([[0.0]], dtype=np.float32),
        "frequency_penalty": np.array([[0.0]], dtype=np.float32),
        "min_tokens": np.array([[min_tokens]], dtype=np.int32),
        "return_log_probs": np.array([[return_log_probs]], dtype=bool),
    }
    if seed is not None:
        inputs["seed"] = np.array([[seed]], dtype=np.uint64)
    if adaptive is not None:
        inputs["adaptive_draft"] = np.array([[adaptive]], dtype=bool)
    return inputs


def run(engines, inputs, settings: LoopParameters | None = None, **kwargs):
    settings = settings or loop_parameters()
    request = bls.read_loop_request(inputs, settings)
    return asyncio.run(bls.run_loop(request, settings, engines, **kwargs))


def engine_request(prompt, output_len, **extra) -> dict[str, np.ndarray]:
    """An engine call as the loop sends it (exclude_input_in_output true: the new tokens only)."""
    inputs = {
        "input_ids": np.array([prompt], dtype=np.int32),
        "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
        "request_output_len": np.array([[output_len]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]]),
    }
    for name, value in extra.items():
        inputs[name] = value if isinstance(value, np.ndarray) else np.array([[value]])
    return inputs


# --- the engine models ---------------------------------------------------------------------------


def test_an_engine_request_without_exclude_input_in_output_gets_the_prompt_back(models):
    # The engine models' default, as TensorRT-LLM's engine-level clients read output_ids.
    _, draft = twin_engines(models)
    expected, _ = reference_greedy(models[1], PROMPT, K)
    inputs = engine_request(PROMPT, K)
    del inputs["exclude_input_in_output"]
    outputs = draft.execute(inputs)
    assert outputs["output_ids"][0, 0].tolist() == list(PROMPT) + list(expected)
    assert outputs["sequence_length"].tolist() == [[len(PROMPT) + K]]


def test_draft_engine_returns_k_greedy_tokens_and_their_logits(models):
    _, draft = twin_engines(models)
    expected, expected_logits = reference_greedy(models[1], PROMPT, K)
    outputs = draft.execute(
        engine_request(
            PROMPT, K, runtime_top_k=np.array([[1]], dtype=np.int32), return_generation_logits=np.array([[True]])
        )
    )
    assert outputs["output_ids"].shape == (1, 1, K) and outputs["output_ids"].dtype == np.int32
    assert outputs["output_ids"][0, 0].tolist() == expected
    assert outputs["sequence_length"].tolist() == [[K]]
    logits = outputs["generation_logits"]
    assert logits.shape == (1, 1, K, 64)
    assert np.allclose(logits[0, 0], torch.stack(expected_logits).numpy(), atol=1e-4)


def test_draft_engine_stops_after_end_id(models):
    _, draft = twin_engines(models)
    expected, _ = reference_greedy(models[1], PROMPT, K)
    end_id = expected[1]
    outputs = draft.execute(engine_request(PROMPT, K, end_id=np.array([[end_id]], dtype=np.int32)))
    assert outputs["output_ids"][0, 0].tolist() == expected[: expected.index(end_id) + 1]


def test_target_verifies_all_drafts_in_one_forward_pass(models):
    target, _ = twin_engines(models)
    reference, _ = reference_greedy(models[0], PROMPT, K + 1)
    forwards = []
    engine = target.pool.engine_for(PROMPT)
    original = engine.runner.forward
    engine.runner.forward = lambda tokens, start, n: forwards.append(tokens.shape[1]) or original(tokens, start, n)
    drafts = reference[:2] + [63 if reference[2] != 63 else 62, reference[3]]  # the third draft is wrong
    outputs = target.execute(engine_request(PROMPT, K + 1, draft_input_ids=np.array([drafts], dtype=np.int32)))
    assert outputs["output_ids"][0, 0].tolist() == reference[:3]  # 2 accepted + the target's own
    assert forwards == [len(PROMPT) + K]  # prefill and all K drafts: one forward pass
    # The next step resumes from the cache: only the new positions are run.
    forwards.clear()
    outputs = target.execute(engine_request(PROMPT + reference[:3], 1))
    assert outputs["output_ids"][0, 0].tolist() == [reference[3]] and forwards == [1]


def test_target_sampling_with_and_without_draft_logits_is_reproducible(models):
    target, draft = twin_engines(models)
    sampling = {
        "temperature": np.array([[1.0]], dtype=np.float32),
        "runtime_top_k": np.array([[0]], dtype=np.int32),
        "runtime_top_p": np.array([[1.0]], dtype=np.float32),
    }
    proposal = draft.execute(
        engine_request(
            PROMPT, K, seed=np.array([[5]], dtype=np.uint64), return_generation_logits=np.array([[True]]), **sampling
        )
    )
    drafts = proposal["output_ids"][0]  # [1, K]
    for extra in ({"draft_logits": proposal["generation_logits"][0]}, {}):
        answers = [
            target.execute(
                engine_request(
                    PROMPT, K + 1, draft_input_ids=drafts, seed=np.array([[seed]], dtype=np.uint64), **sampling, **extra
                )
            )["output_ids"][0, 0].tolist()
            for seed in (11, 11, 12, 13, 14)
        ]
        assert answers[0] == answers[1]
        assert 1 <= len(answers[0]) <= K + 1
        assert len({tuple(a) for a in answers}) > 1  # the seed matters


def test_engine_refuses_bad_requests_with_one_line(models):
    target, draft = twin_engines(models)
    cases = [
        (
            draft,
            engine_request(PROMPT, K, draft_input_ids=np.array([[1, 2]], dtype=np.int32)),
            "takes no draft_input_ids",
        ),
        (
            target,
            engine_request(PROMPT, K + 2, draft_input_ids=np.array([[1] * (K + 1)], dtype=np.int32)),
            "max_draft_len",
        ),
        (target, engine_request(PROMPT, 0), "request_output_len must be >= 1"),
        (target, engine_request(PROMPT, 200), "max_seq_len 120"),
        (target, engine_request(PROMPT, 2, beam_width=np.array([[2]], dtype=np.int32)), "beam_width"),
        (
            target,
            engine_request(
                PROMPT,
                2,
                draft_input_ids=np.array([[1, 2]], dtype=np.int32),
                draft_logits=np.zeros((1, 3, 64), dtype=np.float32),
            ),
            "draft_logits must be [2, vocab]",
        ),
    ]
    for engine, inputs, message in cases:
        with pytest.raises(EngineRequestError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
            engine.execute(inputs)
        assert "\n" not in str(caught.value)


def test_sampling_inputs_follow_tensorrt_llm_defaults():
    assert sampling_from_inputs({}).greedy  # nothing sent: TensorRT-LLM decodes greedily
    assert sampling_from_inputs({"runtime_top_k": np.array([[1]])}).greedy
    assert sampling_from_inputs({"temperature": np.array([[0.0]])}).greedy
    # Top-k 0 and top-p 0 (absent or sent) become top-k 1 whatever the temperature: greedy, as
    # upstream's speculative client relies on (it sends temperature 1.0 and nothing else).
    assert sampling_from_inputs({"temperature": np.array([[1.0]])}).greedy
    assert sampling_from_inputs({"temperature": np.array([[0.7]]), "runtime_top_p": np.array([[0.0]])}).greedy
    assert sampling_from_inputs(
        {"temperature": np.array([[0.7]]), "runtime_top_p": np.array([[0.9]])}
    ) == SamplingParams(0.7, 0, 0.9)
    assert sampling_from_inputs({"runtime_top_k": np.array([[5]])}) == SamplingParams(1.0, 5, 1.0)
    with pytest.raises(EngineRequestError, match="top_p"):
        sampling_from_inputs({"temperature": np.array([[1.0]]), "runtime_top_p": np.array([[1.5]])})
    with pytest.raises(EngineRequestError, match="temperature must be a finite number"):  # SamplingParams' check
        sampling_from_inputs({"temperature": np.array([[np.inf]]), "runtime_top_k": np.array([[5]])})


def test_stop_words_list_format():
    assert stop_sequences_from_list(np.array([[0], [-1]])) == ()
    assert stop_sequences_from_list(np.array([[5, 6, 7, 0], [2, 3, -1, -1]])) == ((5, 6), (7,))


# --- the prefix-keyed KV caches --------------------------------------------------------------------


def test_prefix_pool_reuses_in_place_forks_and_evicts(models):
    base = TorchCausalLM(models[0])
    pool = PrefixCachePool(base, capacity=2, max_divergence=K + 1)
    first = pool.engine_for(PROMPT)
    first.logits(PROMPT + [3, 4, 5], 4)  # a verify step: the cache holds 3 drafts
    assert pool.engine_for(PROMPT + [3, 9]) is first  # the same request one step later
    other = [7, 7, 7, 7]
    second = pool.engine_for(other)
    assert second is not first and len(pool) == 2
    second.logits(other, 1)
    # A new request sharing the prompt but not the first one's continuation: the least recently
    # used cache is taken and given a copy of the shared prefix, leaving `first` alone.
    longer = PROMPT + [3, 9] + list(range(10, 20))
    assert pool.engine_for(longer) is first  # now the most recently used
    first.logits(longer, 1)
    third = pool.engine_for(PROMPT + [30])
    assert third is second and third.cached_tokens == PROMPT
    assert first.cached_length == len(PROMPT) + 12
    with torch.inference_mode():
        full = models[0](torch.tensor([PROMPT + [30]])).logits[0, -1:]
    assert torch.allclose(third.logits(PROMPT + [30], 1), full, atol=1e-4)


@pytest.mark.parametrize("runner", ["llama", "hf"])
def test_forked_engines_share_weights_and_keep_their_own_caches(models, runner):
    engine = TorchCausalLM(models[0], runner=runner)
    engine.logits(PROMPT, 1)
    twin = engine.fork()
    twin.copy_prefix_from(engine, 5)
    assert twin.cached_tokens == PROMPT[:5]
    with torch.inference_mode():
        other = [1, 2, 3]
        assert torch.allclose(
            twin.logits(PROMPT[:5] + other, 3), models[0](torch.tensor([PROMPT[:5] + other])).logits[0, -3:], atol=1e-4
        )
        assert torch.allclose(
            engine.logits(PROMPT + [4], 1), models[0](torch.tensor([PROMPT + [4]])).logits[0, -1:], atol=1e-4
        )


# --- the async driver over the engine models ------------------------------------------------------


def in_process(models, prompt, params, seed=None) -> Generation:
    target, draft = models
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    drafter = TorchDrafter(TorchCausalLM(draft)) if params.num_draft_tokens else None
    return Generation(prompt, drafter, TorchVerifier(TorchCausalLM(target)), params, generator)


@pytest.mark.parametrize("k", [0, 1, K])
def test_async_driver_equals_the_in_process_loop_at_temperature_zero(models, k):
    reference = in_process(models, PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=k))
    expected = reference.run()
    engines = LocalEngines(*twin_engines(models))
    streamed = []
    state = run(engines, loop_inputs(PROMPT, k=k, end_id=-1), on_tokens=lambda current, new: streamed.append(list(new)))
    assert state.output == expected and sum(streamed, []) == expected
    assert state.stats.target_calls == reference.stats.target_calls
    assert state.stats.accepted_tokens == reference.stats.accepted_tokens
    # Greedy requests send no sampling inputs, never draft_logits or draft_acceptance_threshold.
    for model, inputs in engines.calls:
        assert not {"temperature", "runtime_top_k", "runtime_top_p", "seed"} & set(inputs)
        assert "draft_logits" not in inputs and "draft_acceptance_threshold" not in inputs
        assert model == T.TARGET or inputs["request_output_len"][0, 0] <= k


def test_concurrent_requests_interleave_and_get_their_own_output(models):
    prompts = [PROMPT, PROMPT[:5], [9, 8, 7, 6, 5], PROMPT[::-1], [3] * 6, PROMPT[2:]]
    expected = [
        in_process(models, p, GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=3)).run() for p in prompts
    ]
    engines = LocalEngines(*twin_engines(models, cache_slots=3))  # fewer caches than requests: still exact
    settings = loop_parameters()

    async def all_requests():
        requests = [bls.read_loop_request(loop_inputs(p, k=3, end_id=-1), settings) for p in prompts]
        return await asyncio.gather(*(bls.run_loop(r, settings, engines) for r in requests))

    states = asyncio.run(all_requests())
    assert [s.output for s in states] == expected
    order = [tuple(inputs["input_ids"][0, :4]) for _, inputs in engines.calls[:12]]
    assert len(set(order)) > 1  # the requests' calls interleave


def test_sampled_requests_are_reproducible_with_a_seed_and_fresh_without(models):
    settings = loop_parameters(use_draft_logits=True)
    outputs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8), ("u1", None), ("u2", None)):
        engines = LocalEngines(*twin_engines(models))
        state = run(engines, loop_inputs(PROMPT, temperature=1.0, seed=seed, end_id=-1, max_tokens=30), settings)
        outputs[name] = state.output
        targets = [inputs for model, inputs in engines.calls if model == T.TARGET]
        assert all("draft_logits" in inputs for inputs in targets if "draft_input_ids" in inputs)
        seeds = [int(inputs["seed"][0, 0]) for _, inputs in engines.calls]
        assert len(set(seeds)) == len(seeds)  # a distinct seed per engine call
    assert outputs["a"] == outputs["b"] and outputs["a"] != outputs["c"]
    assert outputs["u1"] != outputs["u2"]


def test_cancellation_stops_before_the_next_engine_call(models):
    engines = LocalEngines(*twin_engines(models))
    steps = []
    with pytest.raises(bls.Cancelled):
        run(
            engines,
            loop_inputs(PROMPT, end_id=-1),
            on_tokens=lambda state, new: steps.append(new),
            is_cancelled=lambda: len(steps) >= 2,
        )
    assert len(steps) == 2 and len(engines.calls) == 4  # two iterations of draft + target, nothing after


def test_a_draft_returning_fewer_tokens_than_asked(models):
    class ShortDraft(LocalEngines):
        async def infer(self, model, inputs, outputs):
            result = await super().infer(model, inputs, outputs)
            if model == T.DRAFT:  # as after end_id: one token only
                result["output_ids"] = result["output_ids"][:, :, :1]
                result["sequence_length"] = np.array([[1]], dtype=np.int32)
            return result

    expected = in_process(models, PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=1)).run()
    engines = ShortDraft(*twin_engines(models))
    state = run(engines, loop_inputs(PROMPT, end_id=-1))
    assert state.output == expected
    assert len(state.stats.drafted_by_position) == 1  # never more than one draft per step
    assert state.stats.drafted_tokens >= state.stats.target_calls - 1  # (the last step may have no room)
    verified = [
        inputs["draft_input_ids"].shape
        for model, inputs in engines.calls
        if model == T.TARGET and "draft_input_ids" in inputs
    ]
    assert verified and set(verified) == {(1, 1)}


def test_stop_words_eos_and_adaptive_k(models):
    reference = in_process(models, PROMPT, GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=K)).run()
    stop = reference[5:7]
    state = run(LocalEngines(*twin_engines(models)), loop_inputs(PROMPT, end_id=-1, stop_words=[stop, [2, -1]]))
    assert state.output == reference[:7] and state.finish_reason == "stop"
    state = run(LocalEngines(*twin_engines(models)), loop_inputs(PROMPT, end_id=reference[9]))
    assert state.output == reference[: reference.index(reference[9])] and state.finish_reason == "eos"
    state = run(LocalEngines(*twin_engines(models)), loop_inputs(PROMPT, end_id=-1, adaptive=True, max_tokens=40))
    expected = in_process(models, PROMPT, GenerationParams(max_new_tokens=40, num_draft_tokens=K)).run()
    assert state.output == expected


def test_an_engine_failure_and_bad_parameters_raise_one_line(models):
    target, draft = twin_engines(models)
    target.max_seq_len = len(PROMPT) + 3  # the target refuses once the sequence grows
    with pytest.raises(bls.EngineCallError, match="tensorrt_llm: input .* exceeds the engine's max_seq_len"):
        run(LocalEngines(target, draft), loop_inputs(PROMPT, end_id=-1))
    with pytest.raises(GenerationParamsError, match="max_draft_len 4; got 5"):
        bls.read_loop_request(loop_inputs(PROMPT, k=5), loop_parameters())


def test_response_windows_follow_the_protocol():
    windows = bls.ResponseWindows()
    output = list(range(100, 130))
    assert windows.next(output[:3]) == (output[:3], 0)
    assert windows.next(output[:20]) == (output[:20], 3)
    start = T.window_start(20)
    assert windows.next(output) == (output[start:], 20 - start)


def test_loop_parameters_from_the_config():
    given = {
        "target_model": T.TARGET,
        "draft_model": T.DRAFT,
        "max_draft_len": "6",
        "use_draft_logits": "true",
        "adaptive_draft": "true",
        "draft_cost": str(DEFAULT_STEP_COSTS.draft),
        "verify_slope": str(DEFAULT_STEP_COSTS.verify_slope),
        "k_schedule": "",  # no K schedule
        "prior_alpha": "-1",  # no prior acceptance
        "prior_profile": "",  # nor a measured profile
        "sampled_token_match": "false",
        "method": "draft_target",
        "lookup_min_ngram": "1",
        "lookup_max_ngram": "3",
        "vocab_size": str(VOCAB),
    }
    config = {"name": T.LOOP, "parameters": {key: {"string_value": value} for key, value in given.items()}}
    settings = LoopParameters.from_config(config)
    assert settings == loop_parameters(6, use_draft_logits=True, adaptive_draft=True)
    # An older repository's parameters (acceptance, no use_draft_logits) fail at load, naming the keys and the fix.
    del config["parameters"]["use_draft_logits"]
    config["parameters"]["acceptance"] = {"string_value": "probabilistic"}
    expected = r"spec_loop: .*'use_draft_logits'.*'acceptance'.*trt-spec repo"
    with pytest.raises(ModelParametersError, match=expected):
        LoopParameters.from_config(config)


# --- what TensorRT-LLM's backend requires of the loop (runtime/trtllm_emulator/ enforces it too) --------


class RecordingEngines(LocalEngines):
    """Also records what each call requested."""

    def __init__(self, target: TwinEngine, draft: TwinEngine):
        super().__init__(target, draft)
        self.requested: list[tuple[str, list[str]]] = []

    async def infer(self, model, inputs, outputs):
        self.requested.append((model, list(outputs)))
        return await super().infer(model, inputs, outputs)


def test_every_engine_call_requests_sequence_length_and_carries_end_pad_and_stop_words(models):
    engines = RecordingEngines(*twin_engines(models))
    stop = [[5, 6], [2, -1]]
    run(engines, loop_inputs(PROMPT, temperature=1.0, seed=3, stop_words=stop), loop_parameters(use_draft_logits=True))
    assert engines.requested and all(
        {T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name} <= set(outputs) for _, outputs in engines.requested
    )
    for _, inputs in engines.calls:  # both engines, as TensorRT-LLM's own BLS model sends them
        assert inputs[T.END_ID.name].tolist() == [[1]] and inputs[T.PAD_ID.name].tolist() == [[0]]
        assert inputs[T.STOP_WORDS_LIST.name].tolist() == [stop]


def test_draft_logits_sent_are_the_distribution_the_draft_sampled_from():
    from trt_spec.runtime.sampling import SamplingParams, probabilities

    raw = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    sampling = SamplingParams(temperature=0.6, top_k=10, top_p=0.8)
    request = bls.read_loop_request(loop_inputs([1, 2], temperature=0.6, top_k=10, top_p=0.8), loop_parameters())
    sent = torch.from_numpy(bls.draft_distribution_logits(raw.numpy(), request, [1, 2], [3, 4, 5]))
    q = probabilities(raw, sampling)
    # The target takes softmax(draft_logits) as the draft's distribution, with nothing applied.
    torch.testing.assert_close(sent.softmax(dim=-1), q, atol=1e-6, rtol=1e-5)
    assert (sent.softmax(dim=-1)[q == 0] == 0).all() and torch.isfinite(sent).all()


def test_sampled_request_without_draft_logits_is_plain_decoding(models):
    # Token matching after a rejection is biased on TensorRT-LLM's engines (bls.py docstring):
    # without draft logits a sampled request sends no drafts; a greedy one still speculates.
    engines = LocalEngines(*twin_engines(models))
    state = run(
        engines, loop_inputs(PROMPT, temperature=0.8, seed=1, end_id=-1), loop_parameters(use_draft_logits=False)
    )
    assert state.stats.drafted_tokens == 0 and not any(model == T.DRAFT for model, _ in engines.calls)
    engines = LocalEngines(*twin_engines(models))
    state = run(engines, loop_inputs(PROMPT, end_id=-1), loop_parameters(use_draft_logits=False))
    assert state.stats.drafted_tokens > 0
