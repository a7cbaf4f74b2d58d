"""Unit tests of the preprocessing and postprocessing model code, with a small fake of Triton's
``triton_python_backend_utils`` (unit tests only; tests/test_triton_server.py uses the real server)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import parsed_parameters

from trt_spec.repository import configs, flavors
from trt_spec.runtime import tensors as T
from trt_spec.runtime.parameters import ModelParameters, PostprocessingParameters, PreprocessingParameters
from trt_spec.runtime.text import decode, text_delta

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "trt_spec" / "runtime" / "models"
TOKENIZER_DIR = ROOT / "examples" / "pystdlib-pair" / "target"


class _FakeTensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _FakeError:
    def __init__(self, message):
        self._message = message

    def message(self):
        return self._message


class _FakeResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors, self.error = list(output_tensors), error

    def output(self, name):
        return next(t.as_numpy() for t in self.output_tensors if t.name() == name)


class _FakeSender:
    """A decoupled model's response sender: what was sent, with its flags."""

    def __init__(self):
        self.sent: list[tuple[_FakeResponse | None, int]] = []

    def send(self, response=None, flags=0):
        self.sent.append((response, flags))


class _FakeRequest:
    def __init__(self, **inputs):
        self.inputs = {name: _FakeTensor(name, value) for name, value in inputs.items()}
        self.sender = _FakeSender()

    def get_response_sender(self):
        return self.sender

    def is_cancelled(self):
        return False


@pytest.fixture(scope="module")
def pb_utils():
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = _FakeTensor
    fake.TritonError = _FakeError
    fake.InferenceResponse = _FakeResponse
    fake.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    saved = sys.modules.get(fake.__name__)
    sys.modules[fake.__name__] = fake
    yield fake
    if saved is None:
        del sys.modules[fake.__name__]
    else:
        sys.modules[fake.__name__] = saved


def _load(name: str, pb_utils):
    spec = importlib.util.spec_from_file_location(f"_triton_model_{name}", MODELS / name / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pre(pb_utils):
    return _load("spec_preprocessing", pb_utils)


@pytest.fixture(scope="module")
def post(pb_utils):
    return _load("spec_postprocessing", pb_utils)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


# initialize() resolves tokenizer_dir against model.py's folder; an absolute one points at the demo tokenizer.
LIMITS = PreprocessingParameters(
    tokenizer_dir=str(TOKENIZER_DIR),
    add_special_tokens=True,
    max_input_len=32,
    max_seq_len=48,
    max_draft_len=4,
    default_num_draft_tokens=3,
    vocab_size=4096,
    exclude_input_in_output=True,
    draft_logits=False,
)
POSTPROCESSING = PostprocessingParameters(tokenizer_dir=str(TOKENIZER_DIR), loop_model=T.LOOP)


def _initialized(module, parameters: ModelParameters):
    model = module.TritonPythonModel()
    assert Path(Path(module.__file__).parent / parameters.tokenizer_dir) == TOKENIZER_DIR
    model.initialize({"model_config": json.dumps({"parameters": parameters.to_config()})})
    return model


def _request(text="def main():", **extra):
    inputs = {"text_input": np.array([[text.encode()]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    inputs.update(extra)
    return _FakeRequest(**inputs)


# --- preprocessing ---------------------------------------------------------------------------------


def test_preprocessing_fills_defaults_and_tokenizes(pre, tokenizer):
    model = _initialized(pre, LIMITS)
    (response,) = model.execute([_request("def main():")])
    assert response.error is None
    expected = tokenizer("def main():")["input_ids"]
    assert response.output("input_ids").tolist() == [expected]
    assert response.output("input_lengths").tolist() == [[len(expected)]]
    assert response.output("request_output_len").tolist() == [[8]]
    assert response.output("num_draft_tokens").tolist() == [[3]]  # the spec's K
    assert response.output("temperature").tolist() == [[0.0]]
    assert response.output("runtime_top_p").tolist() == [[1.0]]
    assert response.output("streaming").tolist() == [[False]]  # TensorRT-LLM's default
    assert response.output("exclude_input_in_output").tolist() == [[True]]  # the repository's default
    assert response.output("end_id").tolist() == [[tokenizer.eos_token_id]]
    assert response.output("stop_words_list").tolist() == [[[0], [-1]]]
    # Every declared output, with its declared dtype, is produced.
    for tensor in T.PREPROCESSING_OUTPUTS:
        assert response.output(tensor.name).dtype == np.dtype(tensor.numpy_dtype), tensor.name


def test_preprocessing_stop_words_in_trtllm_format(pre, tokenizer):
    model = _initialized(pre, LIMITS)
    words = ["return", "\n\n"]
    (response,) = model.execute([_request(stop_words=np.array([[w.encode() for w in words]], dtype=object))])
    ids = [tokenizer(w, add_special_tokens=False)["input_ids"] for w in words]
    flat = ids[0] + ids[1]
    expected_offsets = [len(ids[0]), len(flat)] + [-1] * (len(flat) - 2)
    assert response.output("stop_words_list").tolist() == [[flat, expected_offsets]]


@pytest.mark.parametrize(
    ("extra", "text", "message"),
    [
        ({"max_tokens": np.array([[0]], dtype=np.int32)}, "x", "max_tokens must be >= 1; got 0"),
        ({"num_draft_tokens": np.array([[5]], dtype=np.int32)}, "x", "max_draft_len 4; got 5"),
        ({"num_draft_tokens": np.array([[-1]], dtype=np.int32)}, "x", "got -1"),
        ({"temperature": np.array([[-0.5]], dtype=np.float32)}, "x", "temperature must be"),
        ({"temperature": np.array([[np.nan]], dtype=np.float32)}, "x", "temperature must be"),
        ({"temperature": np.array([[np.inf]], dtype=np.float32)}, "x", "temperature must be a finite number"),
        ({"top_p": np.array([[0.0]], dtype=np.float32)}, "x", "top_p must be in (0, 1]"),
        ({"top_p": np.array([[1.5]], dtype=np.float32)}, "x", "top_p must be in (0, 1]"),
        ({"top_k": np.array([[5000]], dtype=np.int32)}, "x", "top_k must be between 0"),
        ({}, "", "text_input is empty"),
        ({}, "x " * 40, "over the engine's max_input_len 32"),
        ({"max_tokens": np.array([[47]], dtype=np.int32)}, "def f(): return 1", "over the engine's max_seq_len 48"),
    ],
)
def test_preprocessing_refuses_bad_requests_with_one_line(pre, extra, text, message):
    model = _initialized(pre, LIMITS)
    good, bad = model.execute([_request(), _request(text, **extra)])
    assert good.error is None  # one bad request fails alone
    assert bad.output_tensors == []
    assert message in bad.error.message()
    assert "\n" not in bad.error.message() and "Traceback" not in bad.error.message()


def test_preprocessing_serves_batches_and_refuses_bad_utf8(pre, tokenizer):
    model = _initialized(pre, LIMITS)
    batch = _FakeRequest(
        text_input=np.array([[b"a"], [b"def f(x):"]], dtype=object), max_tokens=np.array([[1], [2]], dtype=np.int32)
    )
    bad_utf8 = _FakeRequest(
        text_input=np.array([[b"\xff\xfe"]], dtype=object), max_tokens=np.array([[1]], dtype=np.int32)
    )
    first, second = model.execute([batch, bad_utf8])
    assert first.error is None
    ids = [tokenizer("a")["input_ids"], tokenizer("def f(x):")["input_ids"]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, ids))
    assert first.output("input_ids").tolist() == [row + [pad] * (width - len(row)) for row in ids]
    assert first.output("input_lengths").tolist() == [[len(ids[0])], [len(ids[1])]]
    assert first.output("request_output_len").tolist() == [[1], [2]]
    assert "not valid UTF-8" in second.error.message()


@pytest.mark.parametrize(
    ("extra", "sampling"),
    [
        ({}, (0.0, 0, 1.0)),  # greedy
        ({"temperature": np.array([[0.8]], dtype=np.float32)}, (0.0, 0, 1.0)),  # neither top_k nor top_p: greedy
        ({"top_k": np.array([[0]], dtype=np.int32)}, (0.0, 0, 1.0)),  # top_k 0 is no top-k: still greedy
        ({"top_p": np.array([[0.9]], dtype=np.float32)}, (1.0, 0, 0.9)),  # sampling at TensorRT-LLM's 1.0
        ({"top_k": np.array([[5]], dtype=np.int32), "temperature": np.array([[0.7]], dtype=np.float32)}, (0.7, 5, 1.0)),
    ],
)
def test_preprocessing_resolves_sampling_as_tensorrt_llm(pre, extra, sampling):
    model = _initialized(pre, LIMITS)
    (response,) = model.execute([_request(**extra)])
    assert response.error is None
    resolved = [response.output(name)[0, 0] for name in ("temperature", "runtime_top_k", "runtime_top_p")]
    assert resolved == pytest.approx(list(sampling))


def test_preprocessing_resolves_the_per_request_options(pre, tokenizer):
    model = _initialized(pre, LIMITS)
    (response,) = model.execute(
        [
            _request(
                exclude_input_in_output=np.array([[False]]),
                end_id=np.array([[7]], dtype=np.int32),
                pad_id=np.array([[3]], dtype=np.int32),
                stream=np.array([[True]]),
                return_num_input_tokens=np.array([[True]]),
                beam_width=np.array([[1]], dtype=np.int32),
                repetition_penalty=np.array([[1.0]], dtype=np.float32),
                min_tokens=np.array([[1]], dtype=np.int32),
                bad_words=np.array([[b""]], dtype=object),
            )
        ]
    )
    assert response.error is None
    assert response.output("exclude_input_in_output").tolist() == [[False]]
    assert response.output("end_id").tolist() == [[7]] and response.output("pad_id").tolist() == [[3]]
    assert response.output("streaming").tolist() == [[True]]
    assert response.output("return_num_input_tokens").tolist() == [[True]]
    assert response.output("return_num_output_tokens").tolist() == [[False]]


def test_unexpected_failure_is_one_short_line(pre):
    model = _initialized(pre, LIMITS)
    model.preprocessor.tokenizer = None  # any bug inside: the client still gets one line
    (response,) = model.execute([_request()])
    assert response.error.message().startswith("preprocessing failed: TypeError:")
    assert "\n" not in response.error.message()


# --- postprocessing: the streaming-safe protocol ----------------------------------------------------


def stream_windows(ids, cuts):
    """The loop's side of the protocol (tensors.py): windows for responses ending after ``cuts``."""
    sent = 0
    for index, cut in enumerate(cuts):
        start = T.window_start(sent)
        yield ids[start:cut], sent - start, index == len(cuts) - 1
        sent = cut


TEXTS = [
    "def f(x):\n    return 'héllo 你好 🎉 — ünïcödé ✓'\n",
    "# 日本語のコメント\nprint('Ωμέγα', \"emoji: 🐍🐍🐍\")",
    "x = 1  # plain ascii only . , !",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_streamed_deltas_concatenate_to_full_decode(post, tokenizer, text, step):
    ids = tokenizer(text)["input_ids"]
    assert any(tokenizer.decode([i]).endswith("\ufffd") for i in ids) or text.isascii()  # splits multi-byte chars
    cuts = list(range(step, len(ids), step)) + [len(ids)]
    deltas = [text_delta(tokenizer, window, context, final) for window, context, final in stream_windows(ids, cuts)]
    assert "".join(deltas) == decode(tokenizer, ids) == text
    assert not any("\ufffd" in delta for delta in deltas)  # no half character is ever sent


def test_incomplete_character_is_held_back_until_it_completes(post, tokenizer):
    ids = tokenizer("你")["input_ids"]
    assert len(ids) >= 2  # one character, several byte tokens
    first = text_delta(tokenizer, ids[:1], 0, False)
    assert first == ""
    assert text_delta(tokenizer, ids, 1, False) == "你"


def test_final_response_flushes_an_incomplete_tail(post, tokenizer):
    ids = tokenizer("你")["input_ids"][:1]
    assert text_delta(tokenizer, ids, 0, True) == decode(tokenizer, ids) == "\ufffd"


def test_postprocessing_model_execute(post, tokenizer):
    # Decoupled: one response per request with the final flag; the loop's other outputs pass through.
    model = _initialized(post, POSTPROCESSING)
    ids = tokenizer("print('é')")["input_ids"]
    window = np.array([ids], dtype=np.int32)
    request = _FakeRequest(
        output_ids=window,
        num_context_tokens=np.array([[2]], dtype=np.int32),
        is_final=np.array([[True]]),
        num_output_tokens=np.array([[len(ids)]], dtype=np.int32),
        acceptance_rate=np.array([[0.5]], dtype=np.float32),
    )
    broken = _FakeRequest(
        output_ids=window, num_context_tokens=np.array([[len(ids) + 1]], dtype=np.int32), is_final=np.array([[True]])
    )
    assert model.execute([request, broken]) is None
    ((good, flags),) = request.sender.sent
    ((bad, _),) = broken.sender.sent
    expected = decode(tokenizer, ids)[len(decode(tokenizer, ids[:2])) :]
    assert flags == 1 and good.output("text_output").tolist() == [expected.encode()]  # 1-D, as TensorRT-LLM's
    assert good.output("num_output_tokens").tolist() == [[len(ids)]] and good.output("acceptance_rate") == 0.5
    assert {t.name() for t in good.output_tensors} == {"text_output", "num_output_tokens", "acceptance_rate"}
    assert "num_context_tokens" in bad.error.message() and "\n" not in bad.error.message()


def test_a_probe_gets_the_final_flag_and_no_response(post):
    model = _initialized(post, POSTPROCESSING)
    probe = _FakeRequest(
        output_ids=np.zeros((1, 0), dtype=np.int32),
        num_context_tokens=np.array([[0]], dtype=np.int32),
        is_final=np.array([[False]]),
        request_key=np.array([[7]], dtype=np.uint64),
    )
    model.execute([probe])
    assert probe.sender.sent == [(None, 1)]


def test_model_tensor_names_match_the_generated_configs(pre):
    # The parameters the preprocessing model reads are exactly those its config carries.
    from trt_spec.plan import make_plan
    from trt_spec.spec import load_spec

    plan = make_plan(load_spec(ROOT / "examples" / "pystdlib-demo.yaml"))
    config = configs.preprocessing_config(flavors.settings_from_plan(plan))
    limits = parsed_parameters(PreprocessingParameters, config)
    assert limits.max_draft_len == plan.spec.num_draft_tokens
    assert limits.max_seq_len == plan.spec.engine.max_seq_len
    assert {i.name for i in config.input} == {t.name for t in T.PREPROCESSING_INPUTS}
