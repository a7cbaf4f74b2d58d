"""Shared fixtures: every test runs with a private HF cache and no network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import trt_spec.errors  # noqa: F401  (import early: fail fast if the package is broken)
from trt_spec.runtime import tensors as T

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEMO_PAIR = EXAMPLES / "pystdlib-pair"
DEMO_EOS = 0  # the demo tokenizer's <|endoftext|>

# Two workloads of different entropy for the small pair (trained on Python): its own domain and English chat.
WORKLOADS = Path(__file__).parent / "data" / "workloads"
CODE = WORKLOADS / "python_prompts.jsonl"
CHAT = WORKLOADS / "chat_prose.jsonl"
CHAT_TEMPLATE = (
    "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)


@pytest.fixture(scope="session")
def chat_spec(tmp_path_factory) -> Path:
    """The demo spec on a copy of the pair whose tokenizer has a chat template (the demo's has none)."""
    root = tmp_path_factory.mktemp("chat-pair")
    pair = root / "pair"
    shutil.copytree(EXAMPLES / "pystdlib-pair", pair)
    config_path = pair / "target" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    spec = yaml.safe_load((EXAMPLES / "pystdlib-demo.yaml").read_text())
    spec["target"]["model"], spec["draft"]["model"] = str(pair / "target"), str(pair / "draft")
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keep tests off the user's HF cache and off any network."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("TRT_SPEC_DEBUG", raising=False)


def gpu_available() -> bool:
    """tensorrt_llm importable and a CUDA GPU present: the condition for `gpu` tests."""
    try:
        import tensorrt_llm  # noqa: F401
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs tensorrt_llm and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- the demo target alone: what every serving path's greedy output must equal -------------------


@pytest.fixture(scope="session")
def target():
    """The demo pair's target as Hugging Face runs it, and its tokenizer (loaded once)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(DEMO_PAIR / "target"), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(DEMO_PAIR / "target"))


_references: dict[tuple, list[int]] = {}


def greedy_reference(target, prompt: str, num_tokens: int, penalties=None) -> list[int]:
    """The target alone: one full forward pass per token, no cache, stopping at EOS, with the
    ensemble's defaults (TensorRT-LLM's ``min_tokens`` 1: EOS never first) or ``penalties``
    (:class:`trt_spec.runtime.penalties.Penalties`), applied as the engines apply them."""
    import torch

    from trt_spec.runtime.penalties import ENGINE_DEFAULT_PENALTIES, adjusted_scores

    penalties = ENGINE_DEFAULT_PENALTIES if penalties is None else penalties
    model, tokenizer = target
    key = (model.config.name_or_path, prompt, num_tokens, penalties)
    if key not in _references:
        tokens = list(tokenizer(prompt)["input_ids"])
        output: list[int] = []
        with torch.inference_mode():
            while len(output) < num_tokens:
                logits = model(torch.tensor([tokens])).logits[0, -1:]
                scores = adjusted_scores(logits, 1.0, penalties.after(len(output)), tokens, (), DEMO_EOS)
                token = int(scores.argmax())
                if token == DEMO_EOS:
                    break
                output.append(token)
                tokens.append(token)
        _references[key] = output
    return _references[key]


def two_token_distribution(checkpoint, prompt: str, sampling, penalties, eos: int) -> dict[str, float]:
    """P(completion text) of two tokens sampled from ``checkpoint`` alone at ``sampling`` with
    ``penalties`` applied as the engines apply them (EOS ends a completion early): what a served
    pair's sampled two-token completions must follow."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trt_spec.runtime.penalties import adjusted_scores
    from trt_spec.runtime.sampling import filtered_softmax

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    start = list(tokenizer(prompt).input_ids)

    def next_probs(tokens: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([tokens])).logits[0, -1:]
        scores = adjusted_scores(
            logits, sampling.temperature, penalties.after(len(tokens) - len(start)), tokens, (), eos
        )
        return filtered_softmax(scores, sampling)[0]

    def text(tokens: list[int]) -> str:
        return tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    distribution: dict[str, float] = {}
    first = next_probs(start)
    for x1 in first.nonzero().flatten().tolist():
        if x1 == eos:
            distribution[""] = distribution.get("", 0.0) + float(first[x1])
            continue
        second = next_probs([*start, x1])
        for x2 in second.nonzero().flatten().tolist():
            completion = text([x1] if x2 == eos else [x1, x2])
            distribution[completion] = distribution.get(completion, 0.0) + float(first[x1] * second[x2])
    return distribution


def chi_square_z(counts, expected: dict, num: int) -> float:
    """Pearson's chi-square of ``counts`` (outcome -> count of ``num`` draws) against ``expected``
    (outcome -> probability) over the outcomes expected >= 5 times (the rest pooled), as a z-score
    by its normal approximation (mean df, variance 2 df)."""
    bins = [outcome for outcome, p in expected.items() if num * p >= 5]
    observed = [counts[outcome] for outcome in bins] + [num - sum(counts[outcome] for outcome in bins)]
    means = [num * expected[outcome] for outcome in bins]
    means.append(num - sum(means))
    chi_square = sum((o - m) ** 2 / m for o, m in zip(observed, means) if m > 0)
    df = len(means) - 1
    return (chi_square - df) / (2 * df) ** 0.5


def decode(target, tokens) -> str:
    return target[1].decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def parsed_parameters(parameters_class, config):
    """A written model config's parameters (a ModelConfig) parsed as its model parses them: Triton
    hands ``initialize`` each parameter as ``{"string_value": text}``."""
    given = {key: {"string_value": value.string_value} for key, value in config.parameters.items()}
    return parameters_class.from_config({"name": config.name, "parameters": given})


def stub_alive(pid: int) -> bool:
    """A python-backend stub still runs as ``pid`` (not a zombie; pids are reused quickly here)."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in "ZX" and b"triton_python_backend_stub" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def http_status(url: str, *, method: str = "GET", headers: dict[str, str] | None = None) -> int:
    """The HTTP status of one request (POST with an empty body)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (connections in TIME_WAIT do not count, as for any server)."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# The demo repository's two quick python models: a server with only these is ready in seconds.
QUICK_MODELS = (T.PREPROCESSING, T.POSTPROCESSING)


def quick_repository(root: Path) -> Path:
    """The demo repository with only :data:`QUICK_MODELS` (no engines), written under ``root``."""
    import shutil

    from trt_spec.repository.writer import write_repository
    from trt_spec.spec import load_spec

    repo = write_repository(load_spec(EXAMPLES / "pystdlib-demo.yaml"), root / "repo", "torch").path
    for model in T.MODEL_NAMES:
        if model not in QUICK_MODELS:
            shutil.rmtree(repo / model)
    return repo


def broken_repo(root: Path) -> Path:
    """A model repository ``root`` whose one python model raises while loading; returns ``root``."""
    model = root / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\nmax_batch_size: 1\n')
    (model / "1" / "model.py").write_text("raise RuntimeError('boom at load')\n")
    return root


def write_tensorrtllm_repository(spec, root: Path) -> Path:
    """``spec``'s tensorrtllm-flavor repository, written as ``root/repo`` (no engines are built)."""
    import os

    from trt_spec.repository.writer import write_repository

    cwd = os.getcwd()
    os.chdir(root)  # the spec's relative paths.engines: no engines are built there
    try:
        return write_repository(spec, root / "repo", "tensorrtllm").path
    finally:
        os.chdir(cwd)


def serve_emulated(spec, root: Path):
    """Start the real (CPU) Triton server on ``spec``'s tensorrtllm-flavor repository, written under
    ``root``, with its engine models in the TensorRT-LLM backend emulator; the caller stops it."""
    from trt_spec.serving.emulation import emulated_repository
    from trt_spec.serving.server import TritonServer

    repo = write_tensorrtllm_repository(spec, root)
    return TritonServer(emulated_repository(repo, spec, root / "served"), ready_timeout_s=240).start()


# The guided-decoding parameters TensorRT-LLM's backend reads with no default.
GUIDED_KEYS = ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")


@pytest.fixture(scope="module")
def written_configs() -> dict[str, dict]:
    """The tensorrtllm engine configs our writer produces for the demo spec, as Triton's dict."""
    from google.protobuf.json_format import MessageToDict

    from trt_spec.plan import make_plan
    from trt_spec.repository import flavors
    from trt_spec.spec import load_spec

    settings = flavors.settings_from_plan(make_plan(load_spec(EXAMPLES / "pystdlib-demo.yaml")), flavor="tensorrtllm")
    result = {}
    for role in ("target", "draft"):
        config = MessageToDict(flavors.engine_config(settings, role), preserving_proto_field_name=True)
        for key in GUIDED_KEYS:  # until the writer writes them everywhere: required by the backend
            config["parameters"].setdefault(key, {"string_value": ""})
        result[role] = config
    return result
