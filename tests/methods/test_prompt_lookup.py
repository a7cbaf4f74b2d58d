"""Prompt lookup and the method registry, without a server: the matcher's scenarios, the spec's
errors, what plan and repo produce for a method without a draft model, and the in-process loop's
exactness (greedy identical to the target alone, sampled distributed as the target)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from conftest import DEMO_PAIR, EXAMPLES

from trt_spec.errors import SpecError
from trt_spec.plan import make_plan
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import methods
from trt_spec.runtime import tensors as T
from trt_spec.runtime.loop import GenerationParams
from trt_spec.runtime.methods.prompt_lookup import ngram_proposal
from trt_spec.runtime.sampling import filtered_softmax, rejection_sample, token_match_verify
from trt_spec.spec import load_spec, parse_spec
from trt_spec.twin import TwinPair

LOOKUP_SPEC = EXAMPLES / "pystdlib-demo-lookup.yaml"


# --- the matcher ----------------------------------------------------------------------------------


def test_the_docstrings_worked_example():
    assert ngram_proposal(list("abcdabceabc"), 2, 1, 3) == ["e", "a"]


@pytest.mark.parametrize(
    ("sequence", "k", "min_ngram", "max_ngram", "expected"),
    [
        ([1, 2, 3, 4], 3, 1, 3, []),  # nothing repeats: no drafts
        ([7], 3, 1, 3, []),  # too short to match anything
        ([5, 6, 9, 5, 6], 3, 1, 3, [9, 5, 6]),  # the suffix "5 6" matched, its continuation proposed
        ([5, 6, 9, 5, 6], 1, 1, 3, [9]),  # at most K tokens
        ([1, 9, 2, 8, 1, 2], 2, 1, 2, [8, 1]),  # no "1 2" before; "2" at 2 is the latest match
        ([1, 2, 7, 3, 2, 8, 1, 2], 2, 1, 2, [7, 3]),  # "1 2" (longer) wins over the later "2"
        ([1, 2, 7, 3, 2, 8, 1, 2], 2, 2, 2, [7, 3]),
        ([3, 2, 8, 4, 2], 2, 2, 3, []),  # only "2" repeats, below min_ngram
        ([4, 1, 4, 2, 4], 2, 1, 1, [2, 4]),  # the most recent "4" of several
        ([4, 4, 4, 4], 3, 1, 3, [4]),  # the latest earlier occurrence may overlap the suffix
    ],
)
def test_ngram_proposal(sequence, k, min_ngram, max_ngram, expected):
    assert ngram_proposal(sequence, k, min_ngram, max_ngram) == expected


def test_ngram_proposal_is_its_definition_on_random_sequences():
    # The plain definition, token by token: the longest suffix first, its latest earlier start.
    def definition(sequence, k, min_ngram, max_ngram):
        length = len(sequence)
        if k < 1 or length < 2:
            return []
        for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
            for start in range(length - size - 1, -1, -1):
                if sequence[start : start + size] == sequence[length - size :]:
                    return sequence[start + size : start + size + k]
        return []

    import random

    rng = random.Random(0)
    for _ in range(3000):
        sequence = [rng.randrange(4) for _ in range(rng.randrange(40))]
        k, min_ngram = rng.randrange(5), rng.randrange(1, 4)
        max_ngram = rng.randrange(min_ngram, 6)
        assert ngram_proposal(sequence, k, min_ngram, max_ngram) == definition(sequence, k, min_ngram, max_ngram)


def test_methods_are_a_registry():
    assert methods.names() == ("draft_target", "hybrid", "prompt_lookup")
    assert methods.get("prompt_lookup").roles == ("target",)
    assert methods.get("hybrid").roles == methods.get("draft_target").roles == ("target", "draft")
    with pytest.raises(
        ValueError, match=r"speculative.method must be one of draft_target, hybrid, prompt_lookup; got 'eagle2'"
    ):
        methods.get("eagle2")


def test_hybrid_asks_the_draft_model_only_where_the_lookup_finds_nothing():
    hybrid, lookup = methods.get("hybrid"), methods.LookupParams(1, 3)
    assert hybrid.propose([1, 2, 3, 1, 2], 2, lookup) == methods.Proposal([3, 1], methods.PROMPT_LOOKUP)
    assert hybrid.propose([1, 2, 3, 4], 2, lookup) is None
    assert methods.get("draft_target").propose([1, 2, 3, 1, 2], 2, lookup) is None
    assert methods.get("prompt_lookup").propose([1, 2, 3, 4], 2, lookup) == methods.Proposal([], methods.PROMPT_LOOKUP)


# --- the spec -------------------------------------------------------------------------------------

BASE = {"name": "x", "target": {"model": str(DEMO_PAIR / "target")}}
DRAFT = {"model": str(DEMO_PAIR / "draft")}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"speculative": {"method": "eagle2"}},
            r"^speculative.method: unknown method 'eagle2'; choose one of draft_target, hybrid, prompt_lookup$",
        ),
        (
            {"speculative": {"method": "prompt_lookup", "prompt_lookup": {"max_ngram": 0}}},
            r"^speculative.prompt_lookup.max_ngram: Input should be greater than or equal to 1; got 0$",
        ),
        (
            {"speculative": {"method": "prompt_lookup", "prompt_lookup": {"max_ngram": 65}}},
            r"^speculative.prompt_lookup.max_ngram: Input should be less than or equal to 64; got 65$",
        ),
        (
            {"speculative": {"method": "prompt_lookup", "prompt_lookup": {"max_ngram": 2, "min_ngram": 3}}},
            r"^speculative.prompt_lookup.min_ngram: .*min_ngram \(3\) is larger than max_ngram \(2\); set min_ngram <= max_ngram$",
        ),
        (
            {"speculative": {"method": "prompt_lookup", "prompt_lookup": {"n": 3}}},
            r"^speculative.prompt_lookup.n: unknown key; the keys here are: max_ngram, min_ngram$",
        ),
        (
            {"speculative": {"method": "prompt_lookup"}, "draft": DRAFT},
            r"^draft: speculative.method prompt_lookup uses no draft model, but the spec names '.*draft'; "
            r"remove the draft section, or set speculative.method: hybrid",
        ),
        (
            {"speculative": {"method": "hybrid"}},
            r"^draft: required for speculative.method hybrid .*add a draft section",
        ),
    ],
)
def test_bad_method_input_gets_one_error_naming_key_value_and_fix(extra, message):
    with pytest.raises(SpecError, match=message):
        parse_spec({**BASE, **extra})


def test_draft_target_stays_the_default():
    spec = parse_spec({**BASE, "draft": DRAFT})
    assert spec.speculative.method == "draft_target" and spec.roles == ("target", "draft")


# --- plan and repository --------------------------------------------------------------------------


def test_plan_builds_the_target_alone_in_external_draft_mode():
    plan = make_plan(load_spec(LOOKUP_SPEC))
    assert plan.draft is None and plan.memory.draft is None and plan.roles == ("target",)
    argv = plan.target.build_argv
    assert argv[argv.index("--speculative_decoding_mode") + 1] == "draft_tokens_external"
    assert argv[argv.index("--max_draft_len") + 1] == "4"
    assert all(gpu.draft_fixed == 0 for gpu in plan.memory.gpus)
    document = plan.to_json()
    assert document["draft"] is None and document["memory"]["draft"] is None and document["method"] == "prompt_lookup"
    # The KV budget is the target's alone: more tokens than the same target beside a draft.
    with_draft = make_plan(load_spec(EXAMPLES / "pystdlib-demo.yaml"))
    assert plan.memory.kv_tokens > with_draft.memory.kv_tokens


def test_cli_plan_prints_one_build_and_no_draft_engine():
    from click.testing import CliRunner

    from trt_spec.cli import main

    result = CliRunner().invoke(main, ["plan", "--spec", str(LOOKUP_SPEC)])
    assert result.exit_code == 0, result.output
    assert result.output.count("trtllm-build ") == 1
    assert "no draft model" in result.output and "\ndraft " not in result.output


def test_cli_check_passes_the_target_alone():
    from click.testing import CliRunner

    from trt_spec.cli import main

    result = CliRunner().invoke(main, ["check", "--spec", str(LOOKUP_SPEC)])
    assert result.exit_code == 0, result.output
    assert "no draft model to compare it with" in result.output and "(no draft engine)" in result.output
    assert "\ndraft " not in result.output


def test_kubernetes_engine_models_have_no_draft():
    from trt_spec.deploy.manifests import engine_bytes, engine_models

    plan = make_plan(load_spec(LOOKUP_SPEC))
    assert [model.name for model in engine_models(plan, "/models/engines")] == [T.TARGET]
    assert engine_bytes(plan) == plan.memory.target.weights_bytes * plan.memory.target.tp_size


@pytest.mark.parametrize("flavor", ["torch", "tensorrtllm"])
def test_repository_has_no_draft_engine_model(tmp_path, flavor, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tensorrtllm flavor looks for engines under paths.engines
    repo = write_repository(load_spec(LOOKUP_SPEC), tmp_path / "repo", flavor).path
    assert not (repo / T.DRAFT).exists() and (repo / T.TARGET / "config.pbtxt").exists()
    loop = (repo / T.LOOP / "config.pbtxt").read_text()
    assert 'string_value: "prompt_lookup"' in loop


def test_llmapi_flavor_refuses_a_method_it_does_not_write(tmp_path):
    from trt_spec.errors import RepositoryError

    # hybrid: TensorRT-LLM's PyTorch backend has no drafter that combines the lookup and a model
    with pytest.raises(RepositoryError, match=r"speculative.method hybrid: the llmapi flavor writes Draft_Target"):
        write_repository(load_spec(EXAMPLES / "pystdlib-wide-hybrid.yaml"), tmp_path / "repo", "llmapi")
    assert not (tmp_path / "repo").exists()  # nothing half-written


# --- exact in-process -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lookup_pair():
    return TwinPair.from_spec(load_spec(LOOKUP_SPEC))


COPY_PROMPT = (
    "def read_text(path):\n    with open(path) as f:\n        return f.read()\n\n\n"
    "def read_bytes(path):\n    with open(path, 'rb') as f:\n"
)


def test_in_process_greedy_lookup_equals_plain_decoding(lookup_pair):
    prompt = lookup_pair.encode(COPY_PROMPT)
    eos = lookup_pair.eos_token_ids
    plain = lookup_pair.generate(prompt, GenerationParams(max_new_tokens=48, num_draft_tokens=0, eos_token_ids=eos))
    speculative = lookup_pair.generate(
        prompt, GenerationParams(max_new_tokens=48, num_draft_tokens=4, eos_token_ids=eos)
    )
    assert speculative.run() == plain.run()
    stats = speculative.stats
    assert stats.accepted_by_source.get(methods.PROMPT_LOOKUP, 0) > 0
    assert set(stats.drafted_by_source) == {methods.PROMPT_LOOKUP}
    assert stats.target_calls < len(speculative.output)


def test_rejection_sampling_against_a_point_mass_is_token_matching_in_distribution():
    # The derivation in methods/prompt_lookup.py, checked numerically: a one-hot q accepts x with
    # probability p(x) and recovers from p without x, so the emitted token follows p exactly.
    generator = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])  # [K + 1 = 2, V]
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # the point mass of draft token 1
    draws = 40_000
    counts = Counter(rejection_sample([1], q, p, generator)[0] for _ in range(draws))
    matched = Counter(token_match_verify([1], p, generator)[0] for _ in range(draws))
    for token, probability in enumerate(p[0].tolist()):
        sigma = (draws * probability * (1 - probability)) ** 0.5
        assert abs(counts[token] - draws * probability) <= 5 * sigma
        assert abs(matched[token] - draws * probability) <= 5 * sigma


def test_in_process_sampled_lookup_follows_the_target(lookup_pair):
    # One drafted token (max_new_tokens 2: the first token comes out of a verification against the
    # lookup's point mass), against the target's own next-token distribution.
    from trt_spec.runtime.sampling import SamplingParams

    prompt = lookup_pair.encode("import os\nimport")
    sampling = SamplingParams(temperature=0.8, top_k=30)
    params = GenerationParams(
        max_new_tokens=2, num_draft_tokens=1, temperature=0.8, top_k=30, eos_token_ids=lookup_pair.eos_token_ids
    )
    runs = 1500
    first, drafted = Counter(), 0
    for seed in range(runs):
        generation = lookup_pair.generate(prompt, params, seed=seed)
        generation.run()
        first[generation.output[0]] += 1
        drafted += generation.stats.drafted_tokens
    assert drafted >= runs  # every request verified a lookup draft
    with torch.inference_mode():
        logits = lookup_pair.target.model(torch.tensor([prompt])).logits[0, -1:].float()
    probs = filtered_softmax(logits / sampling.temperature, sampling)[0]
    for token, probability in enumerate(probs.tolist()):
        if probability * runs < 20:
            continue
        sigma = (runs * probability * (1 - probability)) ** 0.5
        assert abs(first[token] - runs * probability) <= 6 * sigma, (token, first[token], runs * probability)
