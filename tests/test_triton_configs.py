"""Config builders and the repository writer: every config.pbtxt parses back into Triton's own
ModelConfig; the tensorrtllm configs carry what TensorRT-LLM 1.2.x reads; engines that disagree
with the spec are refused."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trt_spec.errors import EngineMismatchError, RepositoryError
from trt_spec.layout import engine_dir
from trt_spec.plan import engine_max_input_len, make_plan
from trt_spec.repository import configs, flavors
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.runtime.parameters import (
    PYTHON_BACKEND_KEYS,
    LoopParameters,
    ModelParametersError,
    PostprocessingParameters,
    PreprocessingParameters,
    TorchEngineParameters,
    TrtllmEngineParameters,
    TrtllmPostprocessingParameters,
    TrtllmPreprocessingParameters,
)
from trt_spec.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = ROOT / "examples" / "pystdlib-demo.yaml"


@pytest.fixture
def demo_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the spec's output paths (engines/, model_repo/) are cwd-relative
    return load_spec(DEMO_SPEC)


def _params(config) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("flavor", ["tensorrtllm", "torch"])
def test_every_written_config_parses_back(demo_spec, tmp_path, flavor):
    result = write_repository(demo_spec, tmp_path / "repo", flavor)
    written = sorted(p.parent.name for p in (tmp_path / "repo").glob("*/config.pbtxt"))
    assert written == sorted(T.MODEL_NAMES)
    for name in written:
        config = text_format.Parse(
            (tmp_path / "repo" / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        assert config.name == name
        assert config.max_batch_size == demo_spec.engine.max_batch_size
    assert sorted(result.models) == sorted(T.MODEL_NAMES)
    for name in written:  # Triton loads only the versions it finds, an ensemble's included
        assert (tmp_path / "repo" / name / "1").is_dir()
    python_models = {T.PREPROCESSING, T.LOOP, T.POSTPROCESSING, T.TRTLLM_PREPROCESSING, T.TRTLLM_POSTPROCESSING}
    python_models |= {T.TARGET, T.DRAFT} if flavor == "torch" else set()
    assert {name for name in written if (tmp_path / "repo" / name / "1" / "model.py").is_file()} == python_models


# TensorRT-LLM 1.2.x's ensemble (triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt):
# name, data type, dims, and whether the input is required; then ours.
TRTLLM_ENSEMBLE_INPUTS = [
    ("text_input", "TYPE_STRING", [1], True),
    ("decoder_text_input", "TYPE_STRING", [1], False),
    ("max_tokens", "TYPE_INT32", [1], True),
    ("num_return_sequences", "TYPE_INT32", [1], False),
    ("bad_words", "TYPE_STRING", [-1], False),
    ("stop_words", "TYPE_STRING", [-1], False),
    ("exclude_input_in_output", "TYPE_BOOL", [1], False),
    ("end_id", "TYPE_INT32", [1], False),
    ("pad_id", "TYPE_INT32", [1], False),
    ("top_k", "TYPE_INT32", [1], False),
    ("top_p", "TYPE_FP32", [1], False),
    ("temperature", "TYPE_FP32", [1], False),
    ("length_penalty", "TYPE_FP32", [1], False),
    ("repetition_penalty", "TYPE_FP32", [1], False),
    ("min_tokens", "TYPE_INT32", [1], False),
    ("presence_penalty", "TYPE_FP32", [1], False),
    ("frequency_penalty", "TYPE_FP32", [1], False),
    ("seed", "TYPE_UINT64", [1], False),
    ("return_log_probs", "TYPE_BOOL", [1], False),
    ("return_context_logits", "TYPE_BOOL", [1], False),
    ("return_generation_logits", "TYPE_BOOL", [1], False),
    ("return_perf_metrics", "TYPE_BOOL", [1], False),
    ("return_num_input_tokens", "TYPE_BOOL", [1], False),
    ("return_num_output_tokens", "TYPE_BOOL", [1], False),
    ("beam_width", "TYPE_INT32", [1], False),
    ("stream", "TYPE_BOOL", [1], False),
    ("prompt_embedding_table", "TYPE_FP16", [-1, -1], False),
    ("prompt_table_extra_id", "TYPE_UINT64", [1], False),
    ("prompt_vocab_size", "TYPE_INT32", [1], False),
    ("embedding_bias_words", "TYPE_STRING", [-1], False),
    ("embedding_bias_weights", "TYPE_FP32", [-1], False),
    ("lora_task_id", "TYPE_UINT64", [1], False),
    ("lora_weights", "TYPE_FP16", [-1, -1], False),
    ("lora_config", "TYPE_INT32", [-1, 3], False),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], False),
    ("guided_decoding_guide", "TYPE_STRING", [1], False),
]
OUR_ENSEMBLE_INPUTS = [
    ("num_draft_tokens", "TYPE_INT32", [1], False),
    ("adaptive_draft", "TYPE_BOOL", [1], False),
    ("random_seed", "TYPE_UINT64", [1], False),
]
TRTLLM_ENSEMBLE_OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]),
    ("cum_log_probs", "TYPE_FP32", [-1]),
    ("output_log_probs", "TYPE_FP32", [-1, -1]),
    ("context_logits", "TYPE_FP32", [-1, -1]),
    ("generation_logits", "TYPE_FP32", [-1, -1, -1]),
    ("batch_index", "TYPE_INT32", [1]),
    ("sequence_index", "TYPE_INT32", [1]),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", [1]),
    ("kv_cache_reused_blocks", "TYPE_INT32", [1]),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", [1]),
    ("arrival_time_ns", "TYPE_INT64", [1]),
    ("first_scheduled_time_ns", "TYPE_INT64", [1]),
    ("first_token_time_ns", "TYPE_INT64", [1]),
    ("last_token_time_ns", "TYPE_INT64", [1]),
    ("acceptance_rate", "TYPE_FP32", [1]),
    ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]),
    ("num_input_tokens", "TYPE_INT32", [1]),
    ("num_output_tokens", "TYPE_INT32", [1]),
]
OUR_ENSEMBLE_OUTPUTS = [
    ("num_target_calls", "TYPE_INT32", [1]),
    ("total_lookup_draft_tokens", "TYPE_INT32", [1]),
    ("total_accepted_lookup_draft_tokens", "TYPE_INT32", [1]),
]


def test_ensemble_matches_the_design_contract(demo_spec):
    config = configs.ensemble_config(flavors.settings_from_plan(make_plan(demo_spec)))
    assert config.max_batch_size > 0
    inputs = {i.name: i for i in config.input}
    assert [
        (i.name, model_config_pb2.DataType.Name(i.data_type), list(i.dims), not i.optional) for i in config.input
    ] == TRTLLM_ENSEMBLE_INPUTS + OUR_ENSEMBLE_INPUTS
    assert not any(i.HasField("reshape") for i in config.input)  # as TensorRT-LLM's: clients send [N, 1]
    assert [(o.name, model_config_pb2.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == (
        TRTLLM_ENSEMBLE_OUTPUTS + OUR_ENSEMBLE_OUTPUTS
    )
    steps = config.ensemble_scheduling.step
    assert [s.model_name for s in steps] == [T.PREPROCESSING, T.LOOP, T.POSTPROCESSING]
    # Every tensor a step consumes is an ensemble input or produced by an earlier step.
    available = set(inputs)
    for step in steps:
        assert set(step.input_map.values()) <= available, step.model_name
        available |= set(step.output_map.values())
    assert {o.name for o in config.output} <= available
    # Every input reaches a step: the seeds and adaptive_draft go to the loop, the rest to preprocessing.
    assert set(steps[1].input_map.values()) & set(inputs) == {"seed", "random_seed", "adaptive_draft"}
    assert set(steps[0].input_map.values()) == set(inputs) - {"seed", "random_seed", "adaptive_draft"}


def test_step_maps_name_real_tensors_of_each_model(demo_spec):
    models = flavors.model_configs(flavors.settings_from_plan(make_plan(demo_spec)))
    for step in models[T.ENSEMBLE].ensemble_scheduling.step:
        model = models[step.model_name]
        assert set(step.input_map) <= {i.name for i in model.input}
        assert set(step.output_map) <= {o.name for o in model.output}
        required = {i.name for i in model.input if not i.optional}
        assert required <= set(step.input_map), step.model_name
    assert models[T.LOOP].model_transaction_policy.decoupled


def test_tensorrtllm_engine_configs_carry_the_backend_parameters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec(ROOT / "examples" / "llama70b-1b-4xh100.yaml")
    plan = make_plan(spec)
    settings = flavors.settings_from_plan(plan, flavor="tensorrtllm", engines_mount="/engines")
    target = flavors.engine_config(settings, "target")
    draft = flavors.engine_config(settings, "draft")
    for config, role in ((target, "target"), (draft, "draft")):
        params = _params(config)
        assert config.backend == "tensorrtllm"
        assert config.max_batch_size == spec.engine.max_batch_size
        assert not config.model_transaction_policy.decoupled
        assert params["gpt_model_path"] == f"/engines/{spec.name}/{role}"
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["enable_kv_cache_reuse"] == "true"
        assert params["exclude_input_in_output"] == "false"  # upstream's engine-level clients expect the prompt
        assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
        assert params["max_tokens_in_paged_kv_cache"] == str(plan.memory.kv_tokens)
        assert 0 < float(params["kv_cache_free_gpu_mem_fraction"]) <= configs.MAX_KV_FRACTION
        assert params["gpu_device_ids"] == ",".join(str(i) for i in range(spec.role(role).tp_size))
    assert spec.target.tp_size == 4 and _params(target)["gpu_device_ids"] == "0,1,2,3"
    target_inputs = {i.name: i for i in target.input}
    assert {"draft_input_ids", "draft_logits"} <= set(target_inputs)
    assert "draft_acceptance_threshold" not in target_inputs  # would make acceptance inexact
    assert "draft_input_ids" not in {i.name for i in draft.input}
    scalar = target_inputs["request_output_len"]
    assert list(scalar.dims) == [1] and scalar.HasField("reshape") and list(scalar.reshape.shape) == []
    assert {"output_ids", "sequence_length", "generation_logits"} <= {o.name for o in target.output}


def test_kv_fraction_admits_the_token_budget_in_any_load_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = make_plan(load_spec(ROOT / "examples" / "llama8b-1b-h200.yaml"))
    fractions = configs.kv_cache_fractions(plan)
    memory, gpu = plan.memory, plan.memory.gpus[0]
    target_kv = memory.target.kv_bytes_per_token * memory.kv_tokens
    draft_kv = memory.draft.kv_bytes_per_token * memory.kv_tokens
    # Worst case: the other engine loaded with its KV cache first.
    assert fractions["target"] * (gpu.capacity - gpu.target_fixed - gpu.draft_fixed - draft_kv) >= target_kv
    assert fractions["draft"] * (gpu.capacity - gpu.target_fixed - gpu.draft_fixed - target_kv) >= draft_kv
    # ... and not much more than needed when it loads first.
    assert (
        fractions["target"]
        < (target_kv + gpu.headroom) / (gpu.capacity - gpu.target_fixed - gpu.draft_fixed - draft_kv) + 0.01
    )


def test_torch_flavor_engines_are_python_models_with_the_same_tensors(demo_spec):
    settings = flavors.settings_from_plan(make_plan(demo_spec), flavor="torch")
    trtllm = flavors.settings_from_plan(make_plan(demo_spec), flavor="tensorrtllm")
    for role in ("target", "draft"):
        torch_config, trt_config = flavors.engine_config(settings, role), flavors.engine_config(trtllm, role)
        assert torch_config.backend == "python"
        assert list(torch_config.input) == list(trt_config.input)
        assert list(torch_config.output) == list(trt_config.output)


def _fake_engine(spec, role: str, **build_overrides) -> Path:
    directory = engine_dir(spec, role)
    directory.mkdir(parents=True)
    build = {
        "max_batch_size": spec.engine.max_batch_size,
        "max_input_len": engine_max_input_len(spec),  # as plan builds it: what the loop resends
        "max_seq_len": spec.engine.max_seq_len + (spec.num_draft_tokens if role == "target" else 0),
        "max_draft_len": spec.num_draft_tokens if role == "target" else 0,
        "gather_generation_logits": spec.speculative.acceptance == "probabilistic",
    }
    build.update(build_overrides)
    pretrained = {"architecture": "LlamaForCausalLM", "vocab_size": build.pop("vocab_size", 4096)}
    if "logits_dtype" in build:
        pretrained["logits_dtype"] = build.pop("logits_dtype")
    (directory / "config.json").write_text(
        json.dumps({"version": "1.2.0", "pretrained_config": pretrained, "build_config": build})
    )
    return directory


def test_matching_engines_are_accepted(demo_spec, tmp_path):
    for role in ("target", "draft"):
        _fake_engine(demo_spec, role)
    result = write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    assert sum("agrees with the spec" in note for note in result.notes) == 2


def test_without_engines_the_plan_is_used_and_said_so(demo_spec, tmp_path):
    result = write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    assert sum("no engine built" in note for note in result.notes) == 2


@pytest.mark.parametrize(
    ("role", "override", "key"),
    [
        ("target", {"max_batch_size": 4}, "build_config.max_batch_size"),
        ("draft", {"max_batch_size": 16}, "build_config.max_batch_size"),
        ("target", {"max_draft_len": 2}, "build_config.max_draft_len"),
        ("draft", {"vocab_size": 32000}, "pretrained_config.vocab_size"),
        ("target", {"max_input_len": 128}, "build_config.max_input_len"),
        ("draft", {"max_input_len": 512}, "build_config.max_input_len"),  # the spec's max_input_len: too short
    ],
)
def test_engines_that_disagree_with_the_spec_are_refused(demo_spec, tmp_path, role, override, key):
    other = "draft" if role == "target" else "target"
    _fake_engine(demo_spec, other)
    _fake_engine(demo_spec, role, **override)
    with pytest.raises(EngineMismatchError) as caught:
        write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    error = caught.value
    assert error.role == role and error.key == key
    assert str(error.engine_value) in str(error) and str(error.spec_value) in str(error)
    assert "trt-spec build" in str(error)
    assert not (tmp_path / "repo").exists()  # nothing half-written


def test_probabilistic_acceptance_needs_generation_logits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {
        "name": "prob",
        "target": {"model": str(ROOT / "examples/pystdlib-pair/target")},
        "draft": {"model": str(ROOT / "examples/pystdlib-pair/draft")},
        "speculative": {"num_draft_tokens": 4, "acceptance": "probabilistic"},
        "engine": {"max_input_len": 512, "max_seq_len": 1008},
    }
    spec = parse_spec(data)
    _fake_engine(spec, "draft")
    _fake_engine(spec, "target", gather_generation_logits=False)
    with pytest.raises(EngineMismatchError, match="gather_generation_logits"):
        write_repository(spec, tmp_path / "repo", "tensorrtllm")
    # draft_logits and generation_logits travel as FP32: an engine with FP16 logits is refused.
    for role in ("target", "draft"):
        shutil.rmtree(engine_dir(spec, role))
    _fake_engine(spec, "draft", logits_dtype="float16")
    _fake_engine(spec, "target")
    with pytest.raises(EngineMismatchError, match="logits_dtype"):
        write_repository(spec, tmp_path / "repo", "tensorrtllm")


def test_writer_never_replaces_a_foreign_directory(demo_spec, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(RepositoryError, match="refusing to replace"):
        write_repository(demo_spec, out, "tensorrtllm")
    assert (out / "notes.txt").read_text() == "keep me"
    # A previous repository is replaced whole.
    write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    (tmp_path / "repo" / T.PREPROCESSING / "stale.txt").write_text("old")
    write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    assert not (tmp_path / "repo" / T.PREPROCESSING / "stale.txt").exists()


def test_repository_is_relocatable(demo_spec, tmp_path):
    write_repository(demo_spec, tmp_path / "repo", "tensorrtllm")
    for name in (T.PREPROCESSING, T.LOOP, T.POSTPROCESSING):
        version = tmp_path / "repo" / name / "1"
        assert (version / "model.py").is_file()
        # The runtime package travels with the model, and nothing else of trt_spec: the code
        # that wrote the repository.
        assert (version / "trt_spec" / "runtime" / "tensors.py").read_text() == Path(T.__file__).read_text()
        assert (version / "trt_spec" / "runtime" / "loop.py").is_file()
        assert sorted(p.name for p in (version / "trt_spec").iterdir()) == ["__init__.py", "runtime"]
        assert not (version / "trt_spec" / "runtime" / "models").exists() and not list(version.rglob("__pycache__"))
        if name != T.LOOP:
            assert (version / "tokenizer" / "tokenizer.json").is_file()
            params = _params(configs.read_config(tmp_path / "repo" / name / "config.pbtxt"))
            assert not Path(params["tokenizer_dir"]).is_absolute()


def test_bad_config_fails_when_generated_not_when_loaded():
    with pytest.raises(RepositoryError, match="does not validate"):
        configs.to_model_config({"name": "x", "backend": "python", "max_batch_sise": 1})


def test_write_config_is_atomic_and_round_trips(demo_spec, tmp_path):
    config = configs.postprocessing_config(flavors.settings_from_plan(make_plan(demo_spec)))
    path = configs.write_config(config, tmp_path)
    assert path == tmp_path / T.POSTPROCESSING / "config.pbtxt"
    assert configs.read_config(path) == config
    assert [p.name for p in path.parent.iterdir()] == ["config.pbtxt"]  # no temp file left


def test_torch_flavor_runtime_options_reach_the_configs(demo_spec):
    plan = make_plan(demo_spec)
    settings = flavors.settings_from_plan(plan, flavor="torch", torch_threads=2, adaptive_draft=True)
    models = flavors.model_configs(settings)
    for name in (T.TARGET, T.DRAFT):
        params = _params(models[name])
        assert params["torch_threads"] == "2"
    loop = _params(models[T.LOOP])
    assert loop["adaptive_draft"] == "true"
    assert loop["use_draft_logits"] == "true"  # the twin can always return its logits
    greedy_engines = _params(configs.loop_config(flavors.settings_from_plan(plan, flavor="tensorrtllm")))
    assert greedy_engines["use_draft_logits"] == "false"  # built without generation logits


def test_cli_repo_writes_a_servable_repository(demo_spec, tmp_path):
    from click.testing import CliRunner

    from trt_spec.cli import main

    result = CliRunner().invoke(
        main, ["repo", "--spec", str(DEMO_SPEC), "--flavor", "torch", "-o", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {tmp_path / 'out'} (torch flavor)" in result.stdout and "note: torch flavor" in result.stdout
    assert "trt-spec serve --repo" in result.stdout
    assert (tmp_path / "out" / T.LOOP / "1" / "model.py").is_file()
    bad = CliRunner().invoke(main, ["repo", "--spec", str(DEMO_SPEC), "--flavor", "onnx"])
    assert bad.exit_code == 2 and "--flavor" in bad.stderr


LOAD_MODEL = """
import sys, types
sys.path.insert(0, sys.argv[1])
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
sys.modules["triton_python_backend_utils"].TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
import importlib.util
spec = importlib.util.spec_from_file_location("model", sys.argv[1] + "/model.py")
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import trt_spec
assert trt_spec.__file__.startswith(sys.argv[1]), trt_spec.__file__  # the copy, not an install
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "yaml", "click", "trt_spec"))))
"""


@pytest.mark.parametrize("name", [T.LOOP, T.PREPROCESSING, T.POSTPROCESSING, T.TARGET])
def test_models_import_only_the_runtime_copy(demo_spec, tmp_path, name):
    import subprocess
    import sys

    write_repository(demo_spec, tmp_path / "repo", "torch")
    version = tmp_path / "repo" / name / "1"
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_MODEL, str(version)], capture_output=True, text=True, check=True
    )
    modules = loaded.stdout.split()
    assert modules and all(m == "trt_spec" or m.startswith("trt_spec.runtime") for m in modules), modules


# --- parameters: typed once (runtime/parameters.py), read back through the same classes -------------

PARAMETER_CLASSES = {
    "torch": {
        T.PREPROCESSING: PreprocessingParameters,
        T.POSTPROCESSING: PostprocessingParameters,
        T.LOOP: LoopParameters,
        T.TARGET: TorchEngineParameters,
        T.DRAFT: TorchEngineParameters,
        T.TRTLLM_PREPROCESSING: TrtllmPreprocessingParameters,
        T.TRTLLM_POSTPROCESSING: TrtllmPostprocessingParameters,
    },
    "tensorrtllm": {
        T.PREPROCESSING: PreprocessingParameters,
        T.POSTPROCESSING: PostprocessingParameters,
        T.LOOP: LoopParameters,
        T.TARGET: TrtllmEngineParameters,
        T.DRAFT: TrtllmEngineParameters,
        T.TRTLLM_PREPROCESSING: TrtllmPreprocessingParameters,
        T.TRTLLM_POSTPROCESSING: TrtllmPostprocessingParameters,
    },
}


@pytest.mark.parametrize("flavor", ["torch", "tensorrtllm"])
def test_each_models_parameters_parse_into_its_typed_class(demo_spec, flavor):
    models = flavors.model_configs(flavors.settings_from_plan(make_plan(demo_spec), flavor=flavor))
    assert {name for name, config in models.items() if config.parameters} == set(PARAMETER_CLASSES[flavor])
    for name, cls in PARAMETER_CLASSES[flavor].items():
        # The dict Triton hands a python model's initialize() (json.loads(args["model_config"])).
        model_config = json_format.MessageToDict(models[name], preserving_proto_field_name=True)
        assert name in cls.MODELS
        # A renamed field or key breaks here, not when a server loads the model.
        assert set(model_config["parameters"]) == {field.name for field in dataclasses.fields(cls)}, name
        parameters = cls.from_config(model_config)
        written = json_format.ParseDict({"parameters": parameters.to_config()}, model_config_pb2.ModelConfig())
        assert written.parameters == models[name].parameters, name
        assert cls.from_config({"parameters": parameters.to_config()}) == parameters


def test_python_models_read_their_parameters_through_the_typed_classes():
    # No model.py parses config parameters by hand. The exception: the stand-in for TensorRT-LLM's
    # C++ backend reads the tensorrtllm parameters as that backend does (runtime/trtllm_emulator/load.py).
    for path in (ROOT / "trt_spec" / "runtime" / "models").glob("*/model.py"):
        source = path.read_text()
        assert "string_value" not in source, path
        if path.parent.name != "tensorrtllm_emulator":
            assert "Parameters.from_config(" in source, path


def test_from_config_refuses_missing_unknown_and_malformed_parameters():
    good = LoopParameters(
        target_model=T.TARGET,
        draft_model=T.DRAFT,
        max_draft_len=4,
        adaptive_draft=False,
        use_draft_logits=True,
        draft_cost=0.08,
        verify_slope=0.3,
    )
    config = {"name": T.LOOP, "parameters": good.to_config()}
    assert good.to_config()["use_draft_logits"] == {"string_value": "true"}
    # Triton's python backend reads a few keys of its own; they are not ours to refuse.
    backend_keys = {key: {"string_value": "x"} for key in PYTHON_BACKEND_KEYS}
    assert LoopParameters.from_config({"parameters": {**config["parameters"], **backend_keys}}) == good
    missing = {"name": T.LOOP, "parameters": {k: v for k, v in config["parameters"].items() if k != "max_draft_len"}}
    with pytest.raises(ModelParametersError, match=r"spec_loop: config.pbtxt has no parameter 'max_draft_len'"):
        LoopParameters.from_config(missing)
    unknown = {"name": T.LOOP, "parameters": {**config["parameters"], "acceptance": {"string_value": "greedy"}}}
    with pytest.raises(ModelParametersError, match=r"the unknown parameter 'acceptance'.*trt-spec repo --spec F"):
        LoopParameters.from_config(unknown)
    for key, text in (("max_draft_len", "four"), ("adaptive_draft", "yes")):
        bad = {"name": T.LOOP, "parameters": {**config["parameters"], key: {"string_value": text}}}
        with pytest.raises(ModelParametersError, match=f"parameter '{key}' must be a"):
            LoopParameters.from_config(bad)
    fraction = TrtllmEngineParameters.from_config(
        {
            "parameters": {
                **{field.name: {"string_value": "1"} for field in dataclasses.fields(TrtllmEngineParameters)},
                "kv_cache_free_gpu_mem_fraction": {"string_value": "0.125"},
                "enable_kv_cache_reuse": {"string_value": "true"},
                "enable_chunked_context": {"string_value": "false"},
                "exclude_input_in_output": {"string_value": "true"},
                "normalize_log_probs": {"string_value": "true"},
                "speculative_decoding_fast_logits": {"string_value": "false"},
            }
        }
    )
    assert fraction.kv_cache_free_gpu_mem_fraction == 0.125 and fraction.enable_kv_cache_reuse is True


def _tensor_names() -> set[str]:
    return {value.name for value in vars(T).values() if isinstance(value, T.Tensor)}


# Tensor names that are also plain words elsewhere: "stop" (the engines' stop input) is the loop's
# finish reason, as OpenAI names it.
_ALSO_WORDS = {"stop"}


def test_no_tensor_name_is_typed_outside_tensors_py():
    # Every other file of the runtime and the repository writer names a tensor as T.<TENSOR>.name.
    all_names = _tensor_names()
    assert {"input_ids", "max_tokens", "stop_words_list", "streaming", "end_id"} <= all_names
    found = []
    for directory in ("runtime", "repository"):
        for path in sorted((ROOT / "trt_spec" / directory).rglob("*.py")):
            if path == Path(T.__file__).resolve():
                continue
            names = all_names - _ALSO_WORDS
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "tensor names typed as literals (use T.<TENSOR>.name): " + "; ".join(found)


def test_preprocessing_outputs_are_the_engine_tensors_made_plain():
    engine = T.by_name(T.TARGET_INPUTS)
    for tensor in T.PREPROCESSING_OUTPUTS:
        assert not (tensor.optional or tensor.ragged or tensor.scalar_reshape), tensor.name
        if tensor.name == T.NUM_DRAFT_TOKENS_IS_DEFAULT.name:  # ours alone: whether the loop's K schedule applies
            assert (tensor.dtype, tensor.dims) == ("BOOL", (1,))
            continue
        # Ours, not engine inputs: num_draft_tokens (the request's K) and the resolved return_num_* flags.
        source = engine.get(tensor.name) or T.by_name(T.ENSEMBLE_INPUTS)[tensor.name]
        assert (tensor.name, tensor.dtype, tensor.dims) == (source.name, source.dtype, source.dims)
