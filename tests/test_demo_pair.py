"""The demo pair (examples/pystdlib-pair): greedy speculative output equals the target alone on
held-out prompts, for both forward runners, and the CLI streams a completion from a spec."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from conftest import DEMO_PAIR
from test_twin import assert_same_greedy, reference_greedy

from trt_spec.bench.prompts import load_prompt_texts
from trt_spec.cli import main
from trt_spec.runtime.loop import GenerationParams
from trt_spec.twin import TwinPair

PROMPT_TOKENS = 48
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def pairs():
    return {
        runner: TwinPair.from_dirs(DEMO_PAIR / "target", DEMO_PAIR / "draft", runner=runner)
        for runner in ("llama", "hf")
    }


@pytest.fixture(scope="module")
def prompts(pairs):
    return [pairs["llama"].encode(entry["text"])[:PROMPT_TOKENS] for entry in load_prompt_texts()[:4]]


@pytest.mark.parametrize("prompt_index", range(4))
def test_greedy_equals_the_target_alone(pairs, prompts, prompt_index):
    prompt = prompts[prompt_index]
    reference, reference_logits = reference_greedy(pairs["hf"].target.model, prompt, NEW_TOKENS)
    for runner, k in (("llama", 2), ("llama", 5), ("hf", 4)):
        pair = pairs[runner]
        params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=k)  # no EOS: compare all tokens
        generation = pair.generate(prompt, params)
        assert_same_greedy(generation.run(), reference, reference_logits)
        assert generation.stats.accepted_tokens > 0  # the draft is useful on this domain


def test_pair_metadata(pairs):
    pair = pairs["llama"]
    assert pair.eos_token_ids == frozenset({0})
    assert pair.target.runner_name == "llama" and pairs["hf"].target.runner_name == "hf"
    assert pair.target.vocab_size == pair.draft.vocab_size == 4096


def write_spec(tmp_path, k: int = 3):
    spec = tmp_path / "demo.yaml"
    spec.write_text(
        f"name: demo\ntarget:\n  model: {DEMO_PAIR / 'target'}\ndraft:\n  model: {DEMO_PAIR / 'draft'}\n"
        f"speculative:\n  num_draft_tokens: {k}\n"
    )
    return spec


def test_cli_generate_streams_the_completion_and_stats(tmp_path):
    spec = write_spec(tmp_path)
    result = CliRunner().invoke(
        main, ["generate", "--local", "--spec", str(spec), "--max-tokens", "24", "def copyfile(src, dst):"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()
    assert "target calls" in result.stderr and "alpha" in result.stderr


def test_cli_generate_needs_a_mode(tmp_path):
    spec = write_spec(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["generate", "--spec", str(spec), "x"])
    assert result.exit_code == 2 and "--local" in result.stderr
    result = runner.invoke(main, ["generate", "--url", "127.0.0.1:8001", "--local", "--spec", str(spec), "x"])
    assert result.exit_code == 2 and "alternatives" in result.stderr
    result = runner.invoke(main, ["generate", "--local", "x"])
    assert result.exit_code == 2 and "--spec" in result.stderr
    result = runner.invoke(main, ["generate", "--local", "--spec", str(spec), "--top-p", "0", "x"])
    assert result.exit_code == 1 and "top_p" in result.stderr


def run_bench(tmp_path, *extra: str):
    spec = write_spec(tmp_path)
    return CliRunner().invoke(
        main,
        [
            "bench",
            "--local",
            "--spec",
            str(spec),
            "--prompts",
            "1",
            "--max-tokens",
            "12",
            "-k",
            "2",
            "--temperature",
            "0",
            "--threads",
            str(torch.get_num_threads()),
            *extra,
        ],
    )


def test_cli_bench_json_rows(tmp_path):
    result = run_bench(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    keys = {
        "k",
        "temperature",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "speedup",
        "acceptance_rate",
        "alpha",
        "tokens_per_target_call",
        "theoretical_tokens_per_target_call",
        "hf_assisted_tokens_per_s",
        "cost_model_speedup",
    }
    fixed = [row for row in rows if not row["adaptive"]]
    assert len(fixed) == 1 and keys <= set(fixed[0])
    assert fixed[0]["k"] == 2 and fixed[0]["hf_assisted_tokens_per_s"] > 0
    assert "recommended K" in result.stderr


def test_cli_bench_table_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bench.png"
    result = run_bench(tmp_path, "--no-hf", "--no-adaptive", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    assert "tok/call" in result.stdout and "recommended K" in result.stdout
    assert plot.stat().st_size > 10_000


def test_cli_profile(tmp_path):
    result = run_bench(tmp_path, "--profile")
    assert result.exit_code == 0, result.output
    assert "ms per iteration" in result.stdout and "verification" in result.stdout
