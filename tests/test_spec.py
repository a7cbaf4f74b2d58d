import pytest
import yaml
from click.testing import CliRunner
from conftest import EXAMPLES

from trt_spec.cli import main
from trt_spec.errors import SpecError
from trt_spec.spec import load_spec, parse_spec

MINIMAL = {
    "name": "pair",
    "target": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
    "draft": {"model": "meta-llama/Llama-3.2-1B-Instruct"},
}


def with_value(path: str, value):
    data = yaml.safe_load(yaml.safe_dump(MINIMAL))
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def test_defaults():
    spec = parse_spec(MINIMAL)
    assert spec.num_draft_tokens == 5
    assert spec.speculative.acceptance == "greedy"
    assert (spec.engine.dtype, spec.engine.gpu) == ("float16", "h100")
    assert spec.triton.flavor == "tensorrtllm"
    assert spec.paths.engines == "engines"


def test_frozen():
    spec = parse_spec(MINIMAL)
    with pytest.raises(Exception):
        spec.name = "other"
    with pytest.raises(Exception):
        spec.engine.max_batch_size = 1


@pytest.mark.parametrize(
    "key_path, value, expected",
    [
        (
            "speculative.num_draft_tokens",
            0,
            "speculative.num_draft_tokens: Input should be greater than or equal to 1; got 0",
        ),
        (
            "speculative.num_draft_tokens",
            17,
            "speculative.num_draft_tokens: Input should be less than or equal to 16; got 17",
        ),
        ("speculative.num_draft_tokens", "4", "speculative.num_draft_tokens: Input should be a valid integer; got '4'"),
        (
            "engine.max_seq_len",
            4096,
            "engine.max_seq_len: max_seq_len (4096) must be greater than max_input_len (4096)",
        ),
        ("target.tp_size", 3, "target.tp_size: tp_size must be one of 1, 2, 4, 8; got 3"),
        ("engine.dtype", "float32", "engine.dtype: Input should be 'float16' or 'bfloat16'; got 'float32'"),
        ("engine.gpu", "a100", "engine.gpu: Input should be 'h100' or 'h200'; got 'a100'"),
        (
            "speculative.acceptance",
            "typical",
            "speculative.acceptance: Input should be 'greedy' or 'probabilistic'; got 'typical'",
        ),
        ("triton.flavor", "vllm", "triton.flavor: Input should be 'llmapi', 'tensorrtllm' or 'torch'; got 'vllm'"),
        (
            "engine.dtypo",
            "float16",
            "engine.dtypo: unknown key; the keys here are: dtype, gpu, max_batch_size, max_input_len, max_seq_len",
        ),
        ("draft.tp_size", 2, "draft: draft.tp_size (2) is larger than target.tp_size (1)"),
        ("name", "bad name!", "name: String should match pattern"),
    ],
)
def test_bad_values_name_key_and_value(key_path, value, expected):
    with pytest.raises(SpecError) as raised:
        parse_spec(with_value(key_path, value))
    assert expected in str(raised.value)
    assert raised.value.key_path.startswith(key_path.split(".")[0])


def test_missing_required_key():
    data = dict(MINIMAL)
    del data["draft"]
    with pytest.raises(SpecError, match=r"^draft: required for speculative.method draft_target .* prompt_lookup"):
        parse_spec(data)


def test_model_must_be_dir_or_repo_id(tmp_path):
    with pytest.raises(SpecError, match=r"target.model: './nowhere' is neither an existing directory"):
        parse_spec(with_value("target.model", "./nowhere"), source_dir=tmp_path)


def test_local_model_is_relative_to_spec_file():
    spec = load_spec(EXAMPLES / "pystdlib-demo.yaml")
    assert spec.target.local_dir(spec.source_dir) == (EXAMPLES / "pystdlib-pair" / "target").resolve()


def test_file_errors(tmp_path):
    with pytest.raises(SpecError, match="spec file not found; `trt-spec init"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML at line 2"):
        load_spec(broken)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="a spec is a YAML mapping"):
        load_spec(listy)


def test_content_hash_ignores_formatting(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(MINIMAL))
    b.write_text("# a comment\n" + yaml.safe_dump(MINIMAL, default_flow_style=True))
    assert load_spec(a).content_hash() == load_spec(b).content_hash()
    assert parse_spec(with_value("speculative.num_draft_tokens", 4)).content_hash() != load_spec(a).content_hash()


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_load(example):
    load_spec(EXAMPLES / example)


def test_bad_spec_is_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_value("speculative.num_draft_tokens", 40)))
    result = CliRunner().invoke(main, ["plan", "--spec", str(bad)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "speculative.num_draft_tokens" in lines[0] and "got 40" in lines[0]


def test_init_writes_a_valid_annotated_spec(tmp_path):
    out = tmp_path / "spec.yaml"
    runner = CliRunner()
    result = runner.invoke(main, ["init", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "# " in text and "num_draft_tokens" in text
    spec = load_spec(out)
    assert spec.num_draft_tokens == 5
    again = runner.invoke(main, ["init", "-o", str(out)])
    assert again.exit_code == 1 and "--force" in again.output


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml"), "--json"],
        ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml")],
        ["check", "--spec", str(EXAMPLES / "pystdlib-wide.yaml"), "--json"],
        ["--help"],
    ],
    ids=["plan-json", "plan", "check-json", "help"],
)
def test_a_closed_stdout_ends_the_command_quietly(argv):
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write (`trt-spec plan --json | true`)
    try:
        result = subprocess.run(
            [sys.executable, "-c", "from trt_spec.cli import main; main()", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""  # no "internal error: BrokenPipeError", no "Exception ignored"
    assert result.returncode == 1  # Click's status for a broken pipe
