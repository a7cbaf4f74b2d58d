"""``trt-spec check``: every problem of a pair becomes a row; fatal rows make the command exit 1.

Each test copies the demo pair, breaks one thing, and looks for that thing (with its values)
in the report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trt_spec.cli import main
from trt_spec.plan.check import check_pair
from trt_spec.spec import parse_spec

DEMO = Path(__file__).resolve().parents[1] / "examples" / "pystdlib-pair"
CHECKS = [
    "target",
    "draft",
    "tokenizer",
    "architecture",
    "remote code",
    "vocabulary",
    "sizes",
    "positions",
    "tensor parallel",
    "dtype",
    "memory",
    "lengths",
]


@pytest.fixture
def pair(tmp_path) -> Path:
    """A private copy of the demo pair, free to break."""
    for role in ("target", "draft"):
        shutil.copytree(DEMO / role, tmp_path / role)
    return tmp_path


def make_spec(pair: Path, **sections) -> object:
    data = {
        "name": "pair",
        "target": {"model": "target"},
        "draft": {"model": "draft"},
        "speculative": {"num_draft_tokens": 4},
        "engine": {"max_input_len": 512, "max_seq_len": 1008},
        "paths": {"checkpoints": str(pair / "checkpoints")},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return parse_spec(data, source_dir=pair)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def row(report, check: str):
    rows = [r for r in report.rows if r.check == check]
    assert rows, f"no {check!r} row in {report.rows}"
    return rows[0]


def test_the_demo_pair_passes_every_check(pair):
    report = check_pair(make_spec(pair))
    assert [r.check for r in report.rows] == CHECKS
    assert all(r.status == "ok" for r in report.rows), report.rows
    assert row(report, "tokenizer").detail == (
        "identical: 4096 ids (BPE, 3839 merges); special ids bos 0, eos 0, pad 0, unk 0"
    )
    assert row(report, "positions").detail == "target 1024 (needs 1012), draft 1024 (needs 1008)"
    assert row(report, "lengths").detail.startswith("engines take inputs up to 1007 tokens (max_seq_len - 1)")


def test_one_token_id_differing_is_fatal_and_named(pair):
    def swap(tokenizer):
        vocab = tokenizer["model"]["vocab"]
        vocab["def"], vocab["class"] = vocab["class"], vocab["def"]

    target_ids = json.loads((pair / "target" / "tokenizer.json").read_text())["model"]["vocab"]
    edit_json(pair / "draft" / "tokenizer.json", swap)
    report = check_pair(make_spec(pair))
    assert not report.ok
    detail = row(report, "tokenizer").detail
    assert row(report, "tokenizer").status == "fatal"
    low, high = sorted([("def", target_ids["def"]), ("class", target_ids["class"])], key=lambda t: t[1])
    assert f"{low[0]!r} is id {low[1]} in target, {high[1]} in draft" in detail
    assert f"{high[0]!r} is id {high[1]} in target, {low[1]} in draft" in detail


def test_a_renamed_token_shows_on_both_sides(pair):
    def rename(tokenizer):
        vocab = tokenizer["model"]["vocab"]
        vocab["zzz-renamed"] = vocab.pop("return")

    edit_json(pair / "draft" / "tokenizer.json", rename)
    detail = row(check_pair(make_spec(pair)), "tokenizer").detail
    assert "'return' (id " in detail and ") only in target" in detail
    assert "'zzz-renamed' (id " in detail and ") only in draft" in detail


def test_merges_normalization_and_special_tokens_are_compared(pair):
    def change(tokenizer):
        merges = tokenizer["model"]["merges"]
        merges[10], merges[11] = merges[11], merges[10]
        tokenizer["pre_tokenizer"] = {"type": "Whitespace"}
        tokenizer["added_tokens"].append(
            {
                "id": 4096,
                "content": "<|pad|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )

    edit_json(pair / "draft" / "tokenizer.json", change)
    edit_json(pair / "draft" / "tokenizer_config.json", lambda c: c.update(pad_token="<|pad|>"))
    detail = row(check_pair(make_spec(pair)), "tokenizer").detail
    assert "merge #10 is" in detail
    assert "pre_tokenizer differs (ByteLevel vs Whitespace)" in detail
    assert "added token id 4096 is nothing in target, '<|pad|>' (special) in draft" in detail
    assert "pad token id 0 in target, 4096 in draft" in detail


def test_sentencepiece_only_tokenizers_compare_by_content(pair):
    for role in ("target", "draft"):
        (pair / role / "tokenizer.json").unlink()
        (pair / role / "tokenizer.model").write_bytes(b"sentencepiece model bytes")
    assert row(check_pair(make_spec(pair)), "tokenizer").status == "ok"
    (pair / "draft" / "tokenizer.model").write_bytes(b"another sentencepiece model")
    tokenizer = row(check_pair(make_spec(pair)), "tokenizer")
    assert tokenizer.status == "fatal" and "cannot compare entry by entry" in tokenizer.detail


def test_padded_vocab_is_a_warning_for_greedy_and_fatal_for_probabilistic(pair):
    edit_json(pair / "target" / "config.json", lambda c: c.update(vocab_size=4160))
    greedy = row(check_pair(make_spec(pair)), "vocabulary")
    assert greedy.status == "warn"
    assert "target has 4160 embedding rows, draft 4096" in greedy.detail
    assert "the tokenizer uses 4096 ids" in greedy.detail
    probabilistic = row(check_pair(make_spec(pair, speculative={"acceptance": "probabilistic"})), "vocabulary")
    assert probabilistic.status == "fatal" and "acceptance: greedy" in probabilistic.detail


def test_an_embedding_smaller_than_the_tokenizer_is_fatal(pair):
    edit_json(pair / "draft" / "config.json", lambda c: c.update(vocab_size=4000))
    vocab = row(check_pair(make_spec(pair)), "vocabulary")
    assert vocab.status == "fatal"
    assert vocab.detail == "draft has 4000 embedding rows but its tokenizer uses ids up to 4095"


def test_unsupported_architectures_and_features_are_fatal(pair):
    edit_json(pair / "draft" / "config.json", lambda c: c.update(architectures=["Qwen2ForCausalLM"]))
    edit_json(
        pair / "target" / "config.json",
        lambda c: c.update(
            attention_bias=True, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
        ),
    )
    architecture = row(check_pair(make_spec(pair)), "architecture")
    assert architecture.status == "fatal"
    assert "draft is Qwen2ForCausalLM; supported: LlamaForCausalLM, MistralForCausalLM" in architecture.detail
    assert "target has attention_bias: true" in architecture.detail
    assert "target uses rope scaling 'yarn'" in architecture.detail


def test_mistral_sliding_window_shorter_than_sequences_is_fatal(pair):
    edit_json(
        pair / "draft" / "config.json",
        lambda c: c.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=512),
    )
    architecture = row(check_pair(make_spec(pair)), "architecture")
    assert architecture.status == "fatal"
    assert "draft attends within a sliding window of 512 tokens but sequences reach 1008" in architecture.detail
    edit_json(pair / "draft" / "config.json", lambda c: c.update(sliding_window=None))
    assert row(check_pair(make_spec(pair)), "architecture").status == "ok"


def test_remote_code_is_refused_unless_the_spec_opts_in(pair):
    edit_json(pair / "target" / "config.json", lambda c: c.update(auto_map={"AutoModelForCausalLM": "modeling.Custom"}))
    refused = row(check_pair(make_spec(pair)), "remote code")
    assert refused.status == "fatal" and "trust_remote_code: true" in refused.detail
    allowed = row(check_pair(make_spec(pair, target={"trust_remote_code": True})), "remote code")
    assert allowed.status == "warn"


def test_a_draft_not_smaller_than_the_target_is_fatal(pair):
    spec = make_spec(pair, target={"model": "draft"}, draft={"model": "target"})
    sizes = row(check_pair(spec), "sizes")
    assert sizes.status == "fatal"
    assert sizes.detail.startswith("draft 6.45M params is 456.9% of target 1.41M")


def test_too_few_positions_is_fatal_with_the_numbers(pair):
    report = check_pair(make_spec(pair, engine={"max_seq_len": 1022}))
    positions = row(report, "positions")
    assert positions.status == "fatal"
    assert positions.detail.startswith("target supports 1024 positions but needs 1026")
    assert "draft" not in positions.detail.split(" (")[0]


def test_a_tp_size_that_does_not_split_the_model_is_fatal(pair):
    edit_json(pair / "target" / "config.json", lambda c: c.update(intermediate_size=690))
    report = check_pair(make_spec(pair, target={"tp_size": 4}))
    assert row(report, "tensor parallel").detail.startswith(
        "target: intermediate_size 690 does not split over tp_size 4"
    )
    # Fewer KV heads than ranks is fine: TensorRT-LLM replicates them.
    edit_json(pair / "target" / "config.json", lambda c: c.update(intermediate_size=688))
    assert row(check_pair(make_spec(pair, target={"tp_size": 8})), "tensor parallel").status == "ok"


def test_bfloat16_weights_into_a_float16_engine_warn(pair):
    edit_json(pair / "target" / "config.json", lambda c: c.update(dtype="bfloat16"))
    dtype = row(check_pair(make_spec(pair)), "dtype")
    assert dtype.status == "warn" and "engine.dtype: bfloat16" in dtype.detail
    assert row(check_pair(make_spec(pair, engine={"dtype": "bfloat16"})), "dtype").status == "ok"


def test_a_plan_that_does_not_fit_and_models_not_downloaded_are_rows(tmp_path):
    spec = parse_spec(
        {
            "name": "big",
            "target": {"model": "meta-llama/Llama-3.1-70B-Instruct", "tp_size": 1},
            "draft": {"model": "meta-llama/Llama-3.2-1B-Instruct"},
            "paths": {"checkpoints": str(tmp_path / "checkpoints")},
        }
    )
    report = check_pair(spec)
    assert row(report, "target").status == "ok"  # the bundled public config.json
    tokenizer = row(report, "tokenizer")
    assert tokenizer.status == "fatal"
    assert "meta-llama/Llama-3.1-70B-Instruct@main has not been downloaded" in tokenizer.detail
    memory = row(report, "memory")
    assert memory.status == "fatal"
    assert "do not fit on 1 x H100" in memory.detail and "target.tp_size: 2" in memory.detail
    # Llama 3.2 1B ties its embeddings and both are bfloat16; nothing else is wrong with this pair.
    assert {r.check for r in report.fatal} == {"tokenizer", "memory"}


def test_cli_check_prints_a_table_and_exits_by_verdict(pair):
    good = pair / "good.yaml"
    good.write_text(
        f"name: pair\ntarget: {{model: target}}\ndraft: {{model: draft}}\n"
        f"engine: {{max_input_len: 512, max_seq_len: 1008}}\npaths: {{checkpoints: {pair / 'checkpoints'}}}\n"
    )
    result = CliRunner().invoke(main, ["check", "--spec", str(good)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2].startswith("tokenizer        ok     identical")
    assert "the pair is fit to build (0 warning(s))" in result.output

    edit_json(pair / "draft" / "tokenizer.json", lambda t: t["model"]["vocab"].update({"def": 4095}))
    result = CliRunner().invoke(main, ["check", "--spec", str(good)])
    assert result.exit_code == 1
    assert "tokenizer        FATAL  the tokenizers differ: " in result.output
    assert "1 fatal problem(s): fix them before building" in result.output

    result = CliRunner().invoke(main, ["check", "--spec", str(good), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["ok"] is False and [r["check"] for r in data["rows"]] == CHECKS
