"""The tensorrtllm-flavor repository of the demo pair served by the real (CPU) Triton server, its
engine models running in the TensorRT-LLM backend emulator (`trt-spec serve --emulate-tensorrtllm`):
the served copy differs from the written repository only in the engine models' backend, every model
loads, the ensemble's greedy output is the target's alone, and what the backend refuses (a config
missing a parameter it requires, a call that does not request sequence_length or lacks
request_output_len) fails through the server with the backend's message. One server for the module.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import DEMO_EOS, DEMO_PAIR, EXAMPLES, decode, greedy_reference, write_tensorrtllm_repository
from google.protobuf import json_format

from trt_spec.bench.prompts import prompt_texts
from trt_spec.cli import main
from trt_spec.client import SpecClient
from trt_spec.errors import RepositoryError, ServerError
from trt_spec.plan import make_plan
from trt_spec.repository.configs import read_config, write_config
from trt_spec.repository.writer import write_repository
from trt_spec.runtime import tensors as T
from trt_spec.runtime.trtllm_emulator import BackendError, EngineFacts, TrtllmBackendEmulator
from trt_spec.serving.emulation import emulated_repository
from trt_spec.serving.server import TritonServer, free_port
from trt_spec.spec import load_spec

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

SPEC_FILE = EXAMPLES / "pystdlib-demo.yaml"
TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")  # the installed console script
ENGINES = {T.TARGET: "target", T.DRAFT: "draft"}
NEW_TOKENS = 24


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_FILE)


@pytest.fixture(scope="module")
def written(tmp_path_factory, spec):
    """The writer's tensorrtllm-flavor repository, and its files' digests as written."""
    path = write_tensorrtllm_repository(spec, tmp_path_factory.mktemp("written"))
    return path, _tree_digest(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory, spec, written):
    return emulated_repository(written[0], spec, tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def server(served):
    running = TritonServer(served, ready_timeout_s=240).start()
    try:
        yield running
    finally:
        running.stop()


def _model_config(path: Path) -> dict:
    """A config.pbtxt as the dict Triton hands a python model's initialize()."""
    return json_format.MessageToDict(read_config(path), preserving_proto_field_name=True)


def _emulator(repo: Path, name: str) -> TrtllmBackendEmulator:
    """The emulator loaded here, in this process, on a served copy's model: the messages to expect."""
    facts = EngineFacts.from_json(json.loads((repo / name / "1" / EngineFacts.FILE).read_text()))
    return TrtllmBackendEmulator.load(_model_config(repo / name / "config.pbtxt"), facts)


def _input(name: str, array: np.ndarray):
    tensor = grpcclient.InferInput(name, list(array.shape), grpcclient.np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _engine_call(tokens: list[int], output_len: int | None = 8) -> dict[str, np.ndarray]:
    """A batch-1 engine request, tensors with their batch dimension."""
    inputs = {
        T.INPUT_IDS.name: np.array([tokens], dtype=np.int32),
        T.INPUT_LENGTHS.name: np.array([[len(tokens)]], dtype=np.int32),
        T.END_ID.name: np.array([[DEMO_EOS]], dtype=np.int32),
    }
    if output_len is not None:
        inputs[T.REQUEST_OUTPUT_LEN.name] = np.array([[output_len]], dtype=np.int32)
    return inputs


def _infer(server, model: str, inputs: dict[str, np.ndarray], outputs: list[str]):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return client.infer(
            model,
            [_input(name, array) for name, array in inputs.items()],
            outputs=[grpcclient.InferRequestedOutput(name) for name in outputs],
        )
    finally:
        client.close()


# --- the served copy ------------------------------------------------------------------------------


def test_the_copy_differs_from_the_written_configs_only_in_backend(written, served):
    repo, digest = written
    assert sorted(path.parent.name for path in served.glob("*/config.pbtxt")) == sorted(T.MODEL_NAMES)
    for name in T.MODEL_NAMES:
        original = read_config(repo / name / "config.pbtxt")
        copy = read_config(served / name / "config.pbtxt")
        if name in ENGINES:
            assert (original.backend, copy.backend) == ("tensorrtllm", "python")
            copy.backend = original.backend
        assert copy == original, name
    assert _tree_digest(repo) == digest  # the written repository is never modified


def test_the_copy_carries_the_emulator_and_the_planned_engines(spec, served):
    plan = make_plan(spec)
    for name, role in ENGINES.items():
        version = served / name / "1"
        assert (version / "model.py").is_file()
        assert (version / "trt_spec" / "runtime" / "trtllm_emulator" / "__init__.py").is_file()
        facts = EngineFacts.from_json(json.loads((version / EngineFacts.FILE).read_text()))
        k = spec.num_draft_tokens if role == "target" else 0
        assert facts == EngineFacts(
            role=role,
            hf_model_dir=str(DEMO_PAIR / role),
            max_batch_size=spec.engine.max_batch_size,
            max_input_len=spec.engine.max_seq_len - 1,  # what the loop resends, as plan builds it
            max_seq_len=spec.engine.max_seq_len + k,  # trtllm-build adds K to the target's
            max_draft_len=k,
            vocab_size=plan.target.model.vocab_size,
            gather_generation_logits=False,  # the demo spec's acceptance is greedy
            max_num_tokens=plan.engine(role).max_num_tokens,
            tokens_per_block=64,  # plan's --tokens_per_block
        )


def test_a_repository_without_tensorrtllm_models_is_refused(tmp_path, spec):
    torch_repo = write_repository(spec, tmp_path / "repo", "torch").path
    with pytest.raises(RepositoryError, match="no tensorrtllm models"):
        emulated_repository(torch_repo, spec, tmp_path / "served")


# --- the model glue, in process (a stand-in pb_utils) -----------------------------------------------


class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _Error:
    CANCELLED = "CANCELLED"

    def __init__(self, message, code=None):
        self.text, self.code = message, code


class _Response:
    def __init__(self, output_tensors=(), error=None):
        self.outputs = {tensor.name(): tensor.as_numpy() for tensor in output_tensors}
        self.error = error


class _Request:
    def __init__(self, inputs, outputs, cancelled=False):
        self._inputs, self._outputs, self._cancelled = inputs, outputs, cancelled

    def inputs(self):
        return [_Tensor(name, array) for name, array in self._inputs.items()]

    def requested_output_names(self):
        return list(self._outputs)

    def request_id(self):
        return ""

    def is_cancelled(self):
        return self._cancelled


@pytest.fixture(scope="module")
def glue(served):
    """The served copy's model.py for tensorrt_llm, initialized in this process."""
    logged: list[str] = []
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor, fake.TritonError, fake.InferenceResponse = _Tensor, _Error, _Response
    fake.Logger = types.SimpleNamespace(log_warn=logged.append, log_info=logged.append)
    saved_module, saved_path = sys.modules.get(fake.__name__), list(sys.path)
    sys.modules[fake.__name__] = fake
    try:
        source = importlib.util.spec_from_file_location("_emulated_tensorrt_llm", served / T.TARGET / "1" / "model.py")
        module = importlib.util.module_from_spec(source)
        source.loader.exec_module(module)
        model = module.TritonPythonModel()
        config = _model_config(served / T.TARGET / "config.pbtxt")
        model.initialize({"model_config": json.dumps(config)})
        yield model, logged
    finally:
        sys.path[:] = saved_path
        if saved_module is None:
            del sys.modules[fake.__name__]
        else:
            sys.modules[fake.__name__] = saved_module


def test_the_glue_answers_each_request_alone(glue, target):
    model, logged = glue
    prompt = target[1]("import os\n")["input_ids"]
    outputs = [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name]
    good = _Request(_engine_call(prompt), outputs)
    refused = _Request(_engine_call(prompt), [T.OUTPUT_IDS.name])
    cancelled = _Request(_engine_call(prompt), outputs, cancelled=True)
    clipped = _Request({**_engine_call(prompt, 2), T.RUNTIME_TOP_K.name: np.array([[2000]], np.int32)}, outputs)
    answered = model.execute([good, refused, cancelled, clipped])
    assert [response.error is None for response in answered] == [True, False, False, True]
    assert answered[0].outputs[T.SEQUENCE_LENGTH.name].reshape(-1)[0] > 0
    assert "sequence_length" in answered[1].error.text and "\n" not in answered[1].error.text
    assert answered[2].error.code == _Error.CANCELLED  # not run
    assert any("TopK (2000) is larger than max supported" in line for line in logged)  # the backend's warning
    assert model.backend.warnings == []


# --- the server -----------------------------------------------------------------------------------


def test_every_model_loads_under_the_emulator(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready()
        assert {name: client.is_model_ready(name) for name in T.MODEL_NAMES} == dict.fromkeys(T.MODEL_NAMES, True)
    finally:
        client.close()


@pytest.mark.parametrize("index", range(3))
def test_greedy_ensemble_output_equals_the_target_alone(server, target, index):
    prompt = prompt_texts(3, 200)[index]
    reference = greedy_reference(target, prompt, NEW_TOKENS)
    with SpecClient(server.grpc_url) as client:
        events = list(client.generate(prompt, max_tokens=NEW_TOKENS))
    assert "".join(event.text for event in events) == decode(target, reference)
    last = events[-1]
    assert last.num_output_tokens == len(reference)  # token for token, not just the same text
    assert last.total_draft_tokens > 0 and last.total_accepted_draft_tokens > 0


def test_a_direct_draft_call_decodes_greedily(server, target):
    prompt = target[1]("import os\n")["input_ids"]
    result = _infer(server, T.DRAFT, _engine_call(prompt), [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name])
    length = int(result.as_numpy(T.SEQUENCE_LENGTH.name).reshape(-1)[0])
    # No exclude_input_in_output sent: the engine config's false keeps the prompt in output_ids.
    assert len(prompt) < length <= len(prompt) + 8 and result.as_numpy(T.OUTPUT_IDS.name).shape[:2] == (1, 1)
    assert result.as_numpy(T.OUTPUT_IDS.name)[0, 0, : len(prompt)].tolist() == list(prompt)


def test_a_call_not_requesting_sequence_length_fails_with_the_backends_message(server, served, target):
    inputs = _engine_call(target[1]("import os\n")["input_ids"])
    with pytest.raises(BackendError) as expected:
        _emulator(served, T.TARGET).execute(inputs, [T.OUTPUT_IDS.name])
    assert "sequence_length" in str(expected.value)
    with pytest.raises(InferenceServerException) as failed:
        _infer(server, T.TARGET, inputs, [T.OUTPUT_IDS.name])
    assert failed.value.message() == str(expected.value)  # the backend's message, nothing else
    # The server goes on serving.
    result = _infer(server, T.TARGET, inputs, [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name])
    assert result.as_numpy(T.SEQUENCE_LENGTH.name).reshape(-1)[0] > 0


def test_a_call_without_request_output_len_fails_with_the_backends_message(server, served, target):
    # request_output_len is a required input, but Triton only counts a request's inputs against the
    # config's required ones: with end_id (optional) in its place the request reaches the backend.
    inputs = _engine_call(target[1]("import os\n")["input_ids"], output_len=None)
    outputs = [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name]
    with pytest.raises(BackendError) as expected:
        _emulator(served, T.TARGET).execute(inputs, outputs)
    assert T.REQUEST_OUTPUT_LEN.name in str(expected.value)
    with pytest.raises(InferenceServerException) as failed:
        _infer(server, T.TARGET, inputs, outputs)
    assert failed.value.message() == str(expected.value)


def test_a_config_missing_a_required_parameter_fails_to_load_with_the_backends_message(tmp_path, spec, written):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(written[0] / T.TARGET, repo / T.TARGET)  # the target alone: a quick load
    config = read_config(repo / T.TARGET / "config.pbtxt")
    assert "tokenizer_dir" in config.parameters, "the writer names tokenizer_dir (TensorRT-LLM's backend reads it)"
    del config.parameters["tokenizer_dir"]
    write_config(config, repo)
    served = emulated_repository(repo, spec, tmp_path / "served")
    with pytest.raises(BackendError) as expected:
        _emulator(served, T.TARGET)
    assert "tokenizer_dir" in str(expected.value)
    failing = TritonServer(served, ready_timeout_s=120)
    try:
        with pytest.raises(ServerError) as failed:
            failing.start()
    finally:
        failing.stop()  # a failed start keeps its log; this test has read it
    assert str(expected.value) in str(failed.value)


# --- the command line -----------------------------------------------------------------------------


def test_emulation_without_a_spec_is_refused_naming_the_fix(written):
    result = CliRunner().invoke(main, ["serve", "--repo", str(written[0]), "--emulate-tensorrtllm"])
    assert result.exit_code == 2
    assert "--emulate-tensorrtllm needs the spec" in result.output and "--spec F" in result.output
    result = CliRunner().invoke(main, ["serve", "--repo", str(written[0]), "--spec", str(SPEC_FILE)])
    assert result.exit_code == 2 and "--spec is only read with --emulate-tensorrtllm" in result.output


def test_serve_emulates_the_engines_and_removes_its_copy_at_stop(tmp_path, written):
    ports = [free_port(), free_port(), free_port()]
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = [TRT_SPEC, "serve", "--repo", str(written[0]), "--emulate-tensorrtllm", "--spec", str(SPEC_FILE)]
    for option, port in zip(("--grpc-port", "--http-port", "--metrics-port"), ports, strict=True):
        command += [option, str(port)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(temp)}
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("ready "), (line, process.stderr.read() if process.poll() is not None else "")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        assert client.is_model_ready(T.TARGET) and client.is_model_ready(T.ENSEMBLE)
        client.close()
        assert any(path.name.startswith("trt-spec-emulated-") for path in temp.iterdir())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        errors = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    notes = [line for line in errors.splitlines() if "emulated" in line]
    assert len(notes) == 1 and T.TARGET in notes[0] and T.DRAFT in notes[0], errors
    assert not any(path.name.startswith("trt-spec-emulated-") for path in temp.iterdir())  # removed at stop
    assert _tree_digest(written[0]) == written[1]


@pytest.mark.parametrize("num_draft_tokens", [4, 0])
def test_greedy_with_penalties_equals_the_target_alone(server, target, num_draft_tokens):
    # The engines apply them (the emulated penalty and ban-words layers); the loop sends each call
    # what is left of min_tokens, since TensorRT-LLM's default of 1 would forbid EOS at every call's start.
    from trt_spec.runtime.penalties import Penalties

    tokenizer = target[1]
    prompt = prompt_texts(3, 200)[0]
    plain = greedy_reference(target, prompt, NEW_TOKENS)
    banned = tokenizer.decode([plain[2]])
    penalties = Penalties(
        repetition_penalty=1.2,
        presence_penalty=0.5,
        min_tokens=NEW_TOKENS,
        bad_words=(tuple(tokenizer.encode(banned, add_special_tokens=False)),),
    )
    expected = greedy_reference(target, prompt, NEW_TOKENS, penalties)
    assert expected != plain
    options = {"repetition_penalty": 1.2, "presence_penalty": 0.5, "min_tokens": NEW_TOKENS, "bad_words": [banned]}
    with SpecClient(server.grpc_url) as client:
        events = list(client.generate(prompt, max_tokens=NEW_TOKENS, num_draft_tokens=num_draft_tokens, **options))
    assert "".join(event.text for event in events) == decode(target, expected)
    assert events[-1].num_output_tokens == len(expected)
    assert (events[-1].total_draft_tokens > 0) == (num_draft_tokens > 0)
