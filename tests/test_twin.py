"""The PyTorch twin on tiny random Llama pairs: engine caching, greedy equality with the target
alone, stopping inside a draft window, seeded sampling, and the sampled output's distribution."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trt_spec.errors import GenerationParamsError
from trt_spec.runtime.loop import Generation, GenerationParams, common_prefix_length
from trt_spec.runtime.sampling import SamplingParams, probabilities
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.twin import TorchDrafter, TorchVerifier

VOCAB = 64
PROMPT = [5, 17, 42, 8, 23, 61, 2, 9]
NEW_TOKENS = 24
RUNNERS = ("llama", "hf")


def tiny_llama(num_layers: int, seed: int, vocab: int = VOCAB) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,  # spread-out logits: greedy ties would be float noise
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def early_exit_draft(target: LlamaForCausalLM) -> LlamaForCausalLM:
    """A 1-layer draft sharing the target's embeddings, first layer and head: correlated with it."""
    draft = tiny_llama(1, seed=99, vocab=target.config.vocab_size)
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if "layers.1." not in k})
    return draft


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(2, seed=0)


@pytest.fixture(scope="module")
def drafts(target_model):
    return {
        "early-exit": early_exit_draft(target_model),
        "independent": tiny_llama(1, seed=1),
        "identical": target_model,
    }


def reference_greedy(model, prompt, num_tokens) -> tuple[list[int], list[torch.Tensor]]:
    """The target alone: a full forward pass per token, no cache; also the logits of each step."""
    tokens, step_logits = list(prompt), []
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = model(torch.tensor([tokens])).logits[0, -1]
            step_logits.append(logits)
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt) :], step_logits


def assert_same_greedy(output, reference, reference_logits):
    """Equal token for token; on failure, report the target's top-2 logit gap where they part."""
    if output == reference[: len(output)] and len(output) == len(reference):
        return
    first = next((i for i, (a, b) in enumerate(zip(output, reference)) if a != b), min(len(output), len(reference)))
    gap = "n/a"
    if first < len(reference_logits):
        top2 = reference_logits[first].topk(2).values
        gap = f"{float(top2[0] - top2[1]):.3g}"
    pytest.fail(
        f"speculative output differs from the target alone at token {first} (top-2 logit gap there: {gap}; "
        f"a true float tie is rare in float32, a bug is not): {output} vs {reference}"
    )


def speculative(target, draft, runner, params, prompt=PROMPT, seed=None) -> Generation:
    target_engine = TorchCausalLM(target, runner=runner)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    drafter = TorchDrafter(TorchCausalLM(draft, runner=runner)) if draft is not None else None
    return Generation(prompt, drafter, TorchVerifier(target_engine), params, generator)


# --- the engine ------------------------------------------------------------------------------


def test_common_prefix_length():
    assert common_prefix_length([], [1, 2]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    long = list(range(500))
    assert common_prefix_length(long, long[:-3] + [7, 7, 7]) == 497
    assert common_prefix_length(long, [1] + long[1:]) == 0  # differs at the head


@pytest.mark.parametrize("runner", RUNNERS)
def test_engine_logits_match_a_full_forward_through_crops(target_model, runner):
    engine = TorchCausalLM(target_model, runner=runner)
    sequence = PROMPT + [3, 4, 5, 6, 7]
    with torch.inference_mode():
        full = target_model(torch.tensor([sequence])).logits[0]  # [L, V]
    assert torch.allclose(engine.logits(sequence, 3), full[-3:], atol=1e-4)
    # Rejected drafts: the last 2 tokens change; only they are recomputed, from the cache.
    changed = sequence[:-2] + [11, 12]
    with torch.inference_mode():
        changed_full = target_model(torch.tensor([changed])).logits[0]
    assert torch.allclose(engine.logits(changed, 3), changed_full[-3:], atol=1e-4)
    longer = changed + [13]
    assert torch.allclose(engine.logits(longer, 1), target_model(torch.tensor([longer])).logits[0, -1:], atol=1e-4)
    # A different sequence altogether.
    other = [9, 9, 9, 9]
    assert torch.allclose(engine.logits(other, 4), target_model(torch.tensor([other])).logits[0], atol=1e-4)


@pytest.mark.parametrize("kernel", ["onednn", "blas"])
def test_projection_kernels_compute_nn_linear(kernel, monkeypatch):
    from trt_spec.runtime import torch_engine

    # Every weight on the chosen kernel, whatever its size.
    monkeypatch.setattr(torch_engine._Linear, "ONEDNN_MIN_ELEMENTS", 0 if kernel == "onednn" else 1 << 62)
    torch.manual_seed(0)
    first, second, bias = torch.randn(48, 40), torch.randn(24, 40), torch.randn(72)
    linear = torch_engine._Linear([first, second], bias)
    weight = torch.cat([first, second])
    if kernel == "onednn" and not torch_engine._onednn_suits(weight):
        pytest.skip("this torch build has no oneDNN prepacked linear")
    assert (linear.packed is not None) == (kernel == "onednn")
    for rows in (1, 2, 5, 8):  # one-token steps and verifications
        x, residual = torch.randn(rows, 40), torch.randn(rows, 72)
        expected = torch.nn.functional.linear(x, weight, bias)
        assert torch.allclose(linear(x), expected, atol=1e-5)
        assert torch.allclose(linear(x, residual=residual), expected + residual, atol=1e-5)


def test_engine_dtypes_map_to_the_twins_precision():
    from trt_spec.runtime.torch_engine import compute_dtypes

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert compute_dtypes("float16", cpu) == (torch.float32, None)  # float16 weights exactly, in float32
    assert compute_dtypes("bfloat16", cpu) == (torch.float32, torch.bfloat16)
    assert compute_dtypes("float16", cuda) == (torch.float16, None)
    assert compute_dtypes("bfloat16", cuda) == (torch.bfloat16, None)
    with pytest.raises(ValueError, match="'float32'.*|.*float16, bfloat16"):
        compute_dtypes("float32", cpu)


@pytest.mark.parametrize("kernel", ["onednn", "blas"])
def test_bfloat16_projections_compute_a_bfloat16_gemm_row_by_row(kernel, monkeypatch):
    from trt_spec.runtime import torch_engine

    monkeypatch.setattr(torch_engine._Linear, "ONEDNN_MIN_ELEMENTS", 0 if kernel == "onednn" else 1 << 62)
    torch.manual_seed(0)
    # from_pretrained hands _Linear weights already rounded to bfloat16
    weight = torch.randn(96, 64).bfloat16().float()
    linear = torch_engine._Linear([weight], None, torch.bfloat16)
    if kernel == "onednn" and linear.packed is None:
        pytest.skip("this torch build has no oneDNN bfloat16 prepacked linear")
    x = torch.randn(8, 64)
    got = linear(x)
    assert got.dtype == torch.float32
    # float32 accumulation over bfloat16 operands (oneDNN also rounds its input and result)
    operand = x.bfloat16().float() if kernel == "onednn" else x
    expected = operand @ weight.t()
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)
    # A row's product does not depend on the rows beside it: on oneDNN bit for bit; MKL's float32
    # kernel (the weights below oneDNN's size) sums in an order that varies with the row count.
    tolerance = 0.0 if kernel == "onednn" else 1e-5
    for rows in (1, 2, 5, 7):
        torch.testing.assert_close(linear(x[:rows]), got[:rows], rtol=0, atol=tolerance)
        torch.testing.assert_close(linear(x[rows : rows + 1]), got[rows : rows + 1], rtol=0, atol=tolerance)


@pytest.mark.parametrize("gemm_dtype", [None, torch.bfloat16])
def test_one_row_alone_is_computed_as_in_a_batch(gemm_dtype):
    from trt_spec.runtime import torch_engine

    # The wide demo target's down projection: oneDNN's one-row kernel sums its 1376 inputs in
    # another order than its batched one (float32: ~1 element in 40 differs in the last bit).
    torch.manual_seed(0)
    weight = torch.randn(512, 1376) * 0.05
    if gemm_dtype is not None:
        weight = weight.bfloat16().float()
    linear = torch_engine._Linear([weight], None, gemm_dtype)
    if linear.packed is None:
        pytest.skip("this torch build has no oneDNN prepacked linear")
    assert linear.one_row_as_two  # the probe found it
    x = torch.randn(64, 1376) * torch.exp2(torch.randint(-8, 9, (64, 1376)).float())
    batched = linear(x)
    for row in range(64):
        assert torch.equal(linear(x[row : row + 1]), batched[row : row + 1]), row
    # a shape whose one-row kernel agrees keeps it
    assert not torch_engine._Linear([torch.randn(1024, 512)], None, gemm_dtype).one_row_as_two


def test_a_bfloat16_engine_loads_rounded_weights(tmp_path):
    model = tiny_llama(2, seed=3)
    model.save_pretrained(tmp_path)
    engine = TorchCausalLM.from_pretrained(tmp_path, device="cpu", engine_dtype="bfloat16")
    assert engine.gemm_dtype == torch.bfloat16
    weight = engine.model.model.layers[0].mlp.up_proj.weight
    assert weight.dtype == torch.float32
    assert torch.equal(weight, model.model.layers[0].mlp.up_proj.weight.bfloat16().float())
    assert TorchCausalLM.from_pretrained(tmp_path, device="cpu").gemm_dtype is None  # float16: float32 as is
    # greedy decoding at bfloat16 agrees with float32 on a well-separated random model
    fp32 = TorchCausalLM(model, runner="llama")
    assert engine.logits(PROMPT, 4).argmax(-1).tolist() == fp32.logits(PROMPT, 4).argmax(-1).tolist()


def test_llama_runner_on_onednn_matches_a_full_forward(target_model, monkeypatch):
    from trt_spec.runtime import torch_engine

    monkeypatch.setattr(torch_engine._Linear, "ONEDNN_MIN_ELEMENTS", 0)
    engine = TorchCausalLM(target_model, runner="llama")
    if engine.runner.layers[0].qkv.packed is None:
        pytest.skip("this torch build has no oneDNN prepacked linear")
    sequence = PROMPT + [3, 4, 5, 6, 7]
    with torch.inference_mode():
        full = target_model(torch.tensor([sequence])).logits[0]  # [L, V]
    assert torch.allclose(engine.logits(sequence[:-4], 1), full[-5:-4], atol=1e-4)
    assert torch.allclose(engine.logits(sequence, 4), full[-4:], atol=1e-4)  # a verification's rows


def test_engine_reuses_the_cache(target_model):
    engine = TorchCausalLM(target_model, runner="llama")
    forwarded = []
    original = engine.runner.forward

    def spy(new_tokens, start, num_logits):
        forwarded.append((new_tokens.shape[1], start))
        return original(new_tokens, start, num_logits)

    engine.runner.forward = spy
    engine.logits(PROMPT, 1)
    engine.logits(PROMPT + [1, 2, 3], 4)  # verify 3 drafts: K + 1 = 4 positions from the cache
    engine.logits(PROMPT + [1, 5], 1)  # 1 accepted, 5 recovered: only the new token
    assert forwarded == [(len(PROMPT), 0), (4, len(PROMPT) - 1), (1, len(PROMPT) + 1)]


def test_engine_refuses_bad_requests(target_model):
    engine = TorchCausalLM(target_model)
    with pytest.raises(ValueError, match="num_positions"):
        engine.logits(PROMPT, 0)
    with pytest.raises(ValueError, match="at most 128"):
        engine.logits([1] * 129, 1)
    with pytest.raises(ValueError, match="runner"):
        TorchCausalLM(target_model, runner="fast")


# --- greedy equality with the target alone ---------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("draft_name", ["early-exit", "independent", "identical"])
def test_greedy_speculative_equals_the_target_alone(target_model, drafts, runner, k, draft_name):
    reference, reference_logits = reference_greedy(target_model, PROMPT, NEW_TOKENS)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=k)
    generation = speculative(target_model, drafts[draft_name], runner, params)
    assert_same_greedy(generation.run(), reference, reference_logits)
    stats = generation.stats
    assert stats.target_calls == stats.iterations
    if draft_name == "identical":
        assert stats.rejections == 0  # the bonus path every step
    if draft_name != "independent":
        assert stats.target_calls < NEW_TOKENS


def test_plain_decoding_on_the_engine_equals_the_target_alone(target_model):
    reference, reference_logits = reference_greedy(target_model, PROMPT, NEW_TOKENS)
    params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=0)
    generation = speculative(target_model, None, "llama", params)
    assert_same_greedy(generation.run(), reference, reference_logits)
    assert generation.stats.target_calls == NEW_TOKENS


# --- stopping inside a draft window ----------------------------------------------------------


def test_eos_inside_a_draft_window(target_model):
    reference, _ = reference_greedy(target_model, PROMPT, NEW_TOKENS)
    stop_at = next(i for i in range(2, NEW_TOKENS) if reference[i] not in reference[:i])
    eos = frozenset({reference[stop_at]})
    params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=5, eos_token_ids=eos)
    generation = speculative(target_model, target_model, "llama", params)  # identical draft: whole windows accepted
    assert generation.run() == reference[:stop_at]
    assert generation.finish_reason == "eos"


def test_max_tokens_inside_a_draft_window(target_model):
    reference, _ = reference_greedy(target_model, PROMPT, 8)
    params = GenerationParams(max_new_tokens=4, num_draft_tokens=5)
    generation = speculative(target_model, target_model, "llama", params)
    assert generation.run() == reference[:4]
    assert generation.finish_reason == "length"
    assert generation.stats.drafted_tokens == 3  # never drafts past the budget


def test_context_limit_is_checked_before_running(target_model):
    from trt_spec.twin import TwinPair

    pair = TwinPair(TorchCausalLM(target_model), TorchCausalLM(target_model), tokenizer=None, eos_token_ids=frozenset())
    with pytest.raises(GenerationParamsError, match="context of 128"):
        pair.generate(PROMPT, GenerationParams(max_new_tokens=118, num_draft_tokens=4))


# --- sampling --------------------------------------------------------------------------------


@pytest.mark.parametrize("runner", RUNNERS)
def test_temperature_one_is_reproducible_with_a_seed(target_model, drafts, runner):
    params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=3, temperature=1.0)
    first = speculative(target_model, drafts["early-exit"], runner, params, seed=7).run()
    again = speculative(target_model, drafts["early-exit"], runner, params, seed=7).run()
    others = [speculative(target_model, drafts["early-exit"], runner, params, seed=s).run() for s in (8, 9)]
    assert first == again
    assert any(other != first for other in others)


def test_sampled_output_follows_the_processed_target_distribution():
    """First and second emitted tokens ~ the target's processed distributions, end to end."""
    vocab, trials, sigmas = 12, 2000, 6.0
    target = tiny_llama(2, seed=3, vocab=vocab)
    draft = early_exit_draft(target)
    sampling = SamplingParams(temperature=1.3, top_k=8)
    prompt = [3, 7, 2]
    with torch.inference_mode():
        first = probabilities(target(torch.tensor([prompt])).logits[0, -1:], sampling)[0]  # [V]
        second = sum(
            first[a] * probabilities(target(torch.tensor([prompt + [a]])).logits[0, -1:], sampling)[0]
            for a in range(vocab)
        )  # [V]: the marginal of the second token
    # 3 new tokens: the first step drafts 2 (a step never drafts past the budget).
    params = GenerationParams(max_new_tokens=3, num_draft_tokens=2, temperature=1.3, top_k=8)
    target_engine, draft_engine = TorchCausalLM(target), TorchCausalLM(draft)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(2, vocab)
    for _ in range(trials):
        output = Generation(prompt, TorchDrafter(draft_engine), TorchVerifier(target_engine), params, generator).run()
        counts[0, output[0]] += 1
        counts[1, output[1]] += 1
    for position, expected in enumerate((first, second)):
        observed = counts[position] / trials
        sigma = (expected * (1 - expected) / trials).clamp_min(1e-12).sqrt()
        worst = float(((observed - expected).abs() / sigma).max())
        assert worst < sigmas, (position, observed, expected)
        assert (observed[expected == 0] == 0).all()  # nothing top-k removed is ever emitted
    assert not math.isclose(float(first.max()), 1.0)  # a real distribution, not a near-greedy one
