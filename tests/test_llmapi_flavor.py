"""The llmapi flavor (TensorRT-LLM's PyTorch backend: trtllm-serve, Triton's llmapi model): what it
writes for the classic deployment and the demo spec, the options validated against the key table of
each TensorRT-LLM line (unknown and other-version keys refused by name), the llmapi config.pbtxt
through Triton's protobuf, the exact trtllm-serve command, and what check and plan say of the route."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES

from trt_spec.plan import engine_route, make_plan
from trt_spec.plan.check import FATAL, WARN, check_pair
from trt_spec.repository import configs, flavors, llm_args
from trt_spec.repository.flavors import llmapi
from trt_spec.repository.flavors.llmapi import LLMAPI_FLAVOR
from trt_spec.repository.llm_args import LlmArgsError, validate_options, validate_yaml
from trt_spec.repository.writer import write_repository
from trt_spec.spec import load_spec

SPECS = {"llama70b": EXAMPLES / "llama70b-1b-4xh100.yaml", "demo": EXAMPLES / "pystdlib-demo.yaml"}


def as_llmapi(spec):
    return spec.model_copy(update={"triton": spec.triton.model_copy(update={"flavor": LLMAPI_FLAVOR})})


@pytest.fixture(scope="module", params=sorted(SPECS))
def spec(request):
    return load_spec(SPECS[request.param])


@pytest.fixture(scope="module", params=llm_args.TRTLLM_VERSIONS)
def version(request):
    return request.param


@pytest.fixture(scope="module")
def written(spec, version, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"llmapi-{spec.name}-{version}") / "repo"
    result = write_repository(spec, out, LLMAPI_FLAVOR, trtllm_version=version)
    return spec, version, result


def test_the_flavor_writes_the_options_the_command_and_the_llmapi_model(written):
    spec, version, result = written
    repo = result.path
    assert result.flavor == LLMAPI_FLAVOR and result.models == ["tensorrt_llm"]
    files = sorted(str(path.relative_to(repo)) for path in repo.rglob("*") if path.is_file())
    assert files == ["tensorrt_llm/1/model.yaml", "tensorrt_llm/config.pbtxt", "trtllm-serve.sh", "trtllm-serve.yaml"]
    assert os.access(repo / "trtllm-serve.sh", os.X_OK)
    # No model.py or runtime copy of ours: the llmapi model's source is upstream's (the notes say where).
    assert any("model.py and helpers.py" in note for note in result.notes)


def test_the_files_validate_under_their_version_table(written):
    spec, version, result = written
    options = validate_yaml(result.path / "trtllm-serve.yaml", version)
    model = validate_yaml(result.path / "tensorrt_llm/1/model.yaml", version, "model_yaml")
    k, batch = spec.num_draft_tokens, spec.engine.max_batch_size
    for parsed in (options, model):
        assert parsed.tensor_parallel_size == spec.target.tp_size
        assert parsed.pipeline_parallel_size == 1
        assert parsed.max_batch_size == batch
        assert parsed.max_num_tokens >= batch * (k + 1)
        assert parsed.max_seq_len == spec.engine.max_seq_len
        assert parsed.speculative_config.decoding_type == "Draft_Target"
        assert parsed.speculative_config.max_draft_len == k
        assert parsed.disable_overlap_scheduler is True
    plan = make_plan(spec)
    assert options.kv_cache_config.max_tokens == plan.memory.kv_tokens
    assert options.kv_cache_config.free_gpu_memory_fraction == configs.kv_cache_fractions(plan)["target"]
    assert model.backend == "pytorch" and model.triton_config.decoupled is True
    draft_key = llm_args.DRAFT_MODEL_KEY[version]
    raw = yaml.safe_load((result.path / "trtllm-serve.yaml").read_text())
    assert draft_key in raw["speculative_config"]
    assert ("use_rejection_sampling" in raw["speculative_config"]) == (version == "1.3")


def test_the_llmapi_config_parses_through_tritons_protobuf(written):
    _, _, result = written
    config = configs.read_config(result.path / "tensorrt_llm" / "config.pbtxt")
    assert config.name == "tensorrt_llm" and config.backend == "python"
    # Upstream: max_batch_size and decoupled come from model.yaml's triton_config, not config.pbtxt.
    assert config.max_batch_size == 0 and not config.HasField("model_transaction_policy")
    inputs = {tensor.name for tensor in config.input}
    assert "text_input" in inputs and "streaming" in inputs and "sampling_param_temperature" in inputs
    assert {"text_output", "acceptance_rate", "total_draft_tokens"} <= {tensor.name for tensor in config.output}


def test_the_command_is_trtllm_serve_on_the_options_beside_it(written, tmp_path):
    spec, version, result = written
    # A stand-in trtllm-serve prints what it was given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtllm-serve").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "trtllm-serve").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    argv = subprocess.run(
        [str(result.path / "trtllm-serve.sh"), "--port", "9000"], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    plan = make_plan(spec)
    expected = llmapi.serve_argv(plan, version, str(result.path / "trtllm-serve.yaml"))[1:]
    assert argv == [*expected, "--port", "9000"]
    assert argv[argv.index("--backend") + 1] == "pytorch"
    assert argv[argv.index("--tp_size") + 1] == str(spec.target.tp_size)
    flag = {"1.2": "--extra_llm_api_options", "1.3": "--config"}[version]
    assert argv[argv.index(flag) + 1] == str(result.path / "trtllm-serve.yaml")


@pytest.fixture(scope="module")
def options():
    plan = make_plan(load_spec(SPECS["llama70b"]))
    return {version: llmapi.llm_options(plan, version) for version in llm_args.TRTLLM_VERSIONS}


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (("tensor_paralel_size",), r"^tensor_paralel_size: unknown key .*did you mean tensor_parallel_size\?"),
        (
            ("speculative_config", "max_draft_lenn"),
            r"^speculative_config\.max_draft_lenn: unknown key .*did you mean max_draft_len\?",
        ),
        (
            ("kv_cache_config", "free_gpu_mem_fraction"),
            r"^kv_cache_config\.free_gpu_mem_fraction: unknown key .*did you mean free_gpu_memory_fraction\?",
        ),
    ],
)
def test_a_misspelled_key_is_refused_by_name(options, version, path, message):
    data = copy.deepcopy(options[version])
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = 1
    with pytest.raises(LlmArgsError, match=message) as caught:
        validate_options(data, version)
    assert caught.value.key_path == ".".join(path)


@pytest.mark.parametrize(
    ("version", "key", "owner"),
    [
        ("1.2", "use_rejection_sampling", "1.3+"),
        ("1.2", "acceptance_rate_window_size", "1.3+"),
        ("1.2", "acceptance_rate_threshold", "1.3+"),
        ("1.3", "acceptance_window", "1.2.x"),
        ("1.3", "acceptance_length_threshold", "1.2.x"),
    ],
)
def test_a_key_of_the_other_version_is_refused_for_this_one(options, version, key, owner):
    data = copy.deepcopy(options[version])
    data["speculative_config"][key] = 1
    refused = rf"speculative_config\.{key}: unknown key .*it is TensorRT-LLM {re.escape(owner)}'s"
    with pytest.raises(LlmArgsError, match=refused):
        validate_options(data, version)
    other = next(v for v in llm_args.TRTLLM_VERSIONS if v != version)
    accepted = copy.deepcopy(options[other])
    accepted["speculative_config"][key] = 1
    validate_options(accepted, other)


def test_both_lines_take_both_names_of_the_draft(options, version):
    data = copy.deepcopy(options[version])
    draft = data["speculative_config"].pop(llm_args.DRAFT_MODEL_KEY[version])
    for key in ("speculative_model", "speculative_model_dir"):
        parsed = validate_options({**data, "speculative_config": {**data["speculative_config"], key: draft}}, version)
        assert parsed.speculative_config.speculative_model == draft
    with pytest.raises(LlmArgsError, match=r"^speculative_config: speculative_model .*must name the draft"):
        validate_options(data, version)


def test_values_are_checked_too(options, version):
    data = copy.deepcopy(options[version])
    data["max_num_tokens"] = data["max_batch_size"] * (data["speculative_config"]["max_draft_len"] + 1) - 1
    with pytest.raises(LlmArgsError, match=r"max_num_tokens \d+ < max_batch_size 8 x \(max_draft_len 5 \+ 1\)"):
        validate_options(data, version)
    data = copy.deepcopy(options[version])
    data["pipeline_parallel_size"] = 2
    with pytest.raises(LlmArgsError, match="no.* pipeline parallelism|pipeline_parallel_size must be 1"):
        validate_options(data, version)
    data = copy.deepcopy(options[version])
    data["kv_cache_config"]["max_tokens"] = "many"
    with pytest.raises(LlmArgsError, match=r"^kv_cache_config\.max_tokens: .*integer"):
        validate_options(data, version)


def test_model_yaml_keys_stay_out_of_the_options_file(options):
    with pytest.raises(LlmArgsError, match=r"^triton_config: unknown key"):
        validate_options({**options["1.3"], "triton_config": {"max_batch_size": 0, "decoupled": True}}, "1.3")


@pytest.mark.parametrize(("given", "line"), [("1.2", "1.2"), ("1.2.1", "1.2"), ("1.3.0rc29", "1.3"), ("1.4", "1.3")])
def test_versions_map_to_their_line(given, line):
    assert llm_args.version_line(given) == line


def test_an_unknown_version_is_refused(tmp_path):
    with pytest.raises(llm_args.RepositoryError, match=r"TensorRT-LLM version must be 1\.2 or 1\.3.*'1\.1'"):
        write_repository(load_spec(SPECS["demo"]), tmp_path / "repo", LLMAPI_FLAVOR, trtllm_version="1.1")


def test_probabilistic_acceptance_asks_for_rejection_sampling_on_1_3():
    spec = load_spec(SPECS["demo"])
    spec = spec.model_copy(update={"speculative": spec.speculative.model_copy(update={"acceptance": "probabilistic"})})
    plan = make_plan(spec)
    assert llmapi.llm_options(plan, "1.3")["speculative_config"]["use_rejection_sampling"] is True
    assert "use_rejection_sampling" not in llmapi.llm_options(plan, "1.2")["speculative_config"]


def test_a_previous_llmapi_repository_is_replaced(tmp_path):
    spec = load_spec(SPECS["demo"])
    out = tmp_path / "repo"
    write_repository(spec, out, LLMAPI_FLAVOR)
    write_repository(spec, out, LLMAPI_FLAVOR, trtllm_version="1.2")
    assert "--extra_llm_api_options" in (out / "trtllm-serve.sh").read_text()


# --- what check and plan say before the user picks the route ---------------------------------------


def llmapi_plan(spec):
    return make_plan(spec, route=flavors.get(LLMAPI_FLAVOR).route(spec))


def test_plan_says_what_the_route_does_differently():
    spec = as_llmapi(load_spec(SPECS["llama70b"]))
    plan = llmapi_plan(spec)
    text = " ".join(plan.notes)
    assert "K is fixed at max_draft_len 5" in text and "num_draft_tokens" in text
    assert "1.2.x" in text and "1.3+" in text and "exact match" in text and "rejection sampling" in text
    assert "no pipeline parallelism" in text and "disable_overlap_scheduler" in text
    # The classic deployment's draft is tp 1 under a tp-4 target: on this route it runs at tp 4.
    assert any("the draft runs at the target's tp 4, not draft.tp_size 1" in w for w in plan.warnings)
    # The engine route's input-length note is not this route's, nor are its engines.
    assert not any("engines take inputs" in note for note in plan.notes)
    assert not plan.builds_engines and plan.to_json()["builds_engines"] is False


def test_plan_of_the_engine_route_is_unchanged():
    spec = load_spec(SPECS["llama70b"])
    for name in ("tensorrtllm", "torch"):
        assert flavors.get(name).route(spec) == engine_route(spec)
    plan = make_plan(spec)
    assert plan.builds_engines and not any("llmapi" in line for line in (*plan.notes, *plan.warnings))


def test_check_has_rows_for_the_route():
    spec = as_llmapi(load_spec(SPECS["demo"]))
    report = check_pair(spec, route=flavors.get(LLMAPI_FLAVOR).route(spec))
    route = [row for row in report.rows if row.check == "llmapi route"]
    assert len(route) == 3 and all(row.status != FATAL for row in route)
    assert not [row for row in report.rows if row.check in ("lengths", "memory") and "llmapi" in row.detail]
    assert report.ok
    # A draft tp that differs is a warning row.
    wider = spec.model_copy(update={"target": spec.target.model_copy(update={"tp_size": 2})})
    rows = [row for row in check_pair(wider, route=flavors.get(LLMAPI_FLAVOR).route(wider)).rows]
    assert [row.status for row in rows if row.check == "llmapi route"].count(WARN) == 1


def test_the_commands_follow_the_specs_flavor(tmp_path):
    """plan, check and build read the route from the spec's flavor: plan prints no trtllm-build
    steps and no loop schedule, check has the route's rows, build refuses with the fix."""
    from click.testing import CliRunner

    from trt_spec.cli import main

    text = Path(SPECS["llama70b"]).read_text()
    assert "flavor: tensorrtllm" in text
    path = tmp_path / "llmapi.yaml"
    path.write_text(text.replace("flavor: tensorrtllm", "flavor: llmapi"))
    plan = CliRunner().invoke(main, ["plan", "--spec", str(path)])
    assert plan.exit_code == 0, plan.output
    assert "trtllm-build" not in plan.output and "the loop model" not in plan.output
    assert f"trt-spec repo --spec {path}" in plan.output and "note: llmapi route: K is fixed" in plan.output
    classic = CliRunner().invoke(main, ["plan", "--spec", str(SPECS["llama70b"])])
    assert "trtllm-build" in classic.output and "the loop model" in classic.output  # the control
    check = CliRunner().invoke(main, ["check", "--spec", str(path), "--json"])
    assert any(row["check"] == "llmapi route" for row in json.loads(check.output)["rows"])
    build = CliRunner().invoke(main, ["build", "--spec", str(path), "--dry-run"])
    assert build.exit_code == 1 and "builds no TensorRT engines" in build.output and "trt-spec repo" in build.output


def test_the_registry_serves_it_and_no_engine_models():
    flavor = flavors.get(LLMAPI_FLAVOR)
    assert "trtllm-serve.yaml" in flavors.ROOT_FILES
    settings = flavors.settings_from_plan(make_plan(load_spec(SPECS["demo"])), flavor=LLMAPI_FLAVOR)
    assert list(flavor.model_configs(settings)) == ["tensorrt_llm"]
    with pytest.raises(llm_args.RepositoryError, match="no engine models"):
        flavor.engine_config(settings, "target")


def test_repo_takes_the_version_on_the_command_line(tmp_path):
    from click.testing import CliRunner

    from trt_spec.cli import main

    out = tmp_path / "repo"
    args = ["repo", "--spec", str(SPECS["demo"]), "--flavor", "llmapi", "-o", str(out)]
    result = CliRunner().invoke(main, [*args, "--trtllm-version", "1.2"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "llmapi route" in result.output
    validate_yaml(out / "trtllm-serve.yaml", "1.2")
    bad = CliRunner().invoke(main, [*args, "--trtllm-version", "0.21"])
    assert bad.exit_code != 0 and "TensorRT-LLM version must be 1.2 or 1.3" in bad.output


def test_a_flavor_writes_only_inside_its_models_and_root_files(tmp_path, monkeypatch):
    flavor = flavors.get(LLMAPI_FLAVOR)
    monkeypatch.setattr(type(flavor), "files", lambda self, plan, settings, trtllm_version=None: {"../x": ""})
    with pytest.raises(llm_args.RepositoryError, match="outside its models and root files"):
        write_repository(load_spec(SPECS["demo"]), tmp_path / "repo", LLMAPI_FLAVOR)
    assert not (tmp_path / "x").exists()


# --- prompt lookup as NGram ------------------------------------------------------------------------


@pytest.mark.parametrize("line", llm_args.TRTLLM_VERSIONS)
def test_a_prompt_lookup_spec_writes_ngram_options(line, tmp_path):
    spec = as_llmapi(load_spec(EXAMPLES / "pystdlib-demo-lookup.yaml"))
    result = write_repository(spec, tmp_path / "repo", LLMAPI_FLAVOR, trtllm_version=line)
    options = yaml.safe_load((result.path / llmapi.OPTIONS_FILE).read_text())
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": spec.num_draft_tokens,
        "max_matching_ngram_size": spec.speculative.prompt_lookup.max_ngram,
        "is_keep_all": True,
        "is_use_oldest": False,  # the newest match, as trt-spec's matcher
        "is_public_pool": False,  # each request's own tokens only
    }
    assert options["disable_overlap_scheduler"] is True
    parsed = validate_yaml(result.path / llmapi.OPTIONS_FILE, line)
    assert isinstance(parsed.speculative_config, llm_args.NGramConfig)
    # NGram keys are NGram's: on a draft-target config they are refused by name, and the reverse.
    draft_target = copy.deepcopy(options)
    draft_target["speculative_config"]["decoding_type"] = "Draft_Target"
    with pytest.raises(LlmArgsError, match=r"^speculative_config\.max_matching_ngram_size: unknown key"):
        validate_options(draft_target, line)
    with_draft = copy.deepcopy(options)
    with_draft["speculative_config"]["speculative_model"] = "/models/draft"
    with pytest.raises(LlmArgsError, match=r"^speculative_config\.speculative_model: unknown key"):
        validate_options(with_draft, line)
    zero = copy.deepcopy(options)
    zero["speculative_config"]["max_draft_len"] = 0
    with pytest.raises(LlmArgsError, match=r"^speculative_config\.max_draft_len: .*greater than 0"):
        validate_options(zero, line)


def test_ngram_refuses_rejection_sampling_and_says_what_it_does_not_write():
    options = llmapi.llm_options(make_plan(as_llmapi(load_spec(EXAMPLES / "pystdlib-demo-lookup.yaml"))), "1.3")
    options["speculative_config"]["use_rejection_sampling"] = True
    with pytest.raises(LlmArgsError, match="use_rejection_sampling must be false for NGram"):
        validate_options(options, "1.3")
    spec = as_llmapi(load_spec(EXAMPLES / "pystdlib-demo-lookup.yaml"))
    lookup = spec.speculative.prompt_lookup.model_copy(update={"min_ngram": 2})
    spec = spec.model_copy(update={"speculative": spec.speculative.model_copy(update={"prompt_lookup": lookup})})
    route = llmapi.FLAVOR.route(spec)
    assert any("min_ngram 2 is not written" in warning for warning in route.warnings)
    assert any("exact token match" in note for note in route.notes)
