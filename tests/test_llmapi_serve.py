"""`trt-spec serve` on an llmapi-flavor repository: the route's trtllm-serve.yaml read as the LLM API
reads it (an unknown key refused by name), served on the PyTorch twin behind the endpoints
trtllm-serve exposes, driven by the `openai` SDK end to end from the files `trt-spec repo --flavor
llmapi` writes.

Two servers, each a `trt-spec serve` process for the module: the demo pair (pystdlib-wide, with a
chat template) as written for TensorRT-LLM 1.3+ from its greedy spec (`use_rejection_sampling: false`:
sampled drafts verified by exact token match), where greedy completions and chats, streamed or not,
equal the target alone; and the small pair written from a probabilistic spec
(`use_rejection_sampling: true`, plus `enable_iter_perf_stats` for /metrics), whose sampled
two-token completions must follow the target's exact distribution (and not the draft's: the
negative control). Which verification each server runs is read back from its loop model's config.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    CHAT_TEMPLATE,
    DEMO_EOS,
    DEMO_PAIR,
    EXAMPLES,
    chi_square_z,
    decode,
    greedy_reference,
    two_token_distribution,
)

from trt_spec.bench.prompts import prompt_texts
from trt_spec.repository import llm_args
from trt_spec.repository.flavors import twin_route
from trt_spec.repository.flavors.llmapi import COMMAND_FILE, OPTIONS_FILE
from trt_spec.repository.llm_args import LlmArgsError
from trt_spec.runtime.penalties import Penalties
from trt_spec.runtime.sampling import SamplingParams
from trt_spec.serving.llmapi_route import loop_counters
from trt_spec.serving.server import free_port

pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
pytest.importorskip("fastapi", reason="the OpenAI endpoint needs trt-spec[openai]")
openai = pytest.importorskip("openai", reason="the tests drive the endpoint with the openai SDK")

TRT_SPEC = str(Path(sys.executable).parent / "trt-spec")
WIDE_PAIR = EXAMPLES / "pystdlib-wide"
MODEL = "target"  # trtllm-serve's name for a local checkpoint: its folder's name
NEW_TOKENS = 24
# The sampled-distribution test, as tests/test_trtllm_emulated_sampling.py: two tokens after "import ".
SAMPLING = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
PENALTIES = Penalties(repetition_penalty=1.3, presence_penalty=0.5, min_tokens=1)
PROMPT = "import "
LOOKUP_PROMPT = "import os\nimport"  # the lookup proposes " os" after "import"
NUM_REQUESTS = 600
CLIENTS = 3


# --- the repositories and servers -----------------------------------------------------------------


def write_llmapi_repo(spec: dict, root: Path, *extra: str) -> Path:
    """`trt-spec repo --flavor llmapi` for ``spec`` (a spec mapping): the repository's path."""
    spec_path = root / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = root / "repo"
    argv = [TRT_SPEC, "repo", "--spec", str(spec_path), "--flavor", "llmapi", "-o", str(out), *extra]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return out


def pair_spec(name: str, target: Path, draft: Path, acceptance: str) -> dict:
    spec = yaml.safe_load((EXAMPLES / "pystdlib-demo.yaml").read_text())
    spec["name"], spec["target"]["model"], spec["draft"]["model"] = name, str(target), str(draft)
    spec["speculative"]["acceptance"] = acceptance
    return spec


class Served:
    """A `trt-spec serve --repo R` process: its ready line, stderr so far, the OpenAI client."""

    def __init__(self, repo: Path, *extra: str):
        self.port = free_port()
        argv = [TRT_SPEC, "serve", "--repo", str(repo), "--openai-port", str(self.port), "--drain-timeout", "0", *extra]
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = self.process.stdout.readline()
        if not self.ready.startswith("ready "):
            self.stop()
            raise AssertionError(f"serve did not get ready: {self.ready}{self.process.stderr.read()}")
        self.fields = dict(word.split("=", 1) for word in self.ready.split()[1:])
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=300)

    def get(self, path: str, base: str | None = None) -> tuple[int, bytes]:
        with urllib.request.urlopen(f"{base or self.url}{path}", timeout=30) as response:
            return response.status, response.read()

    def loop_parameters(self) -> dict[str, str]:
        """The twin's loop-model parameters, from Triton's model-config API (always open)."""
        _, body = self.get("/v2/models/spec_loop/config", base=f"http://{self.fields['http']}")
        return {key: value["string_value"] for key, value in json.loads(body)["parameters"].items()}

    def stop(self) -> str:
        """SIGTERM; stderr of the whole run."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.stderr.read()


@pytest.fixture(scope="module")
def wide_pair(tmp_path_factory) -> Path:
    """The demo pair with a chat template on its target's tokenizer (weights linked, not copied)."""
    root = tmp_path_factory.mktemp("wide-pair")
    for role in ("target", "draft"):
        (root / role).mkdir()
        for path in (WIDE_PAIR / role).iterdir():
            (root / role / path.name).symlink_to(path)
    config_path = root / "target" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.unlink()
    config_path.write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def exact_match_repo(wide_pair, tmp_path_factory) -> Path:
    spec = pair_spec("pystdlib-wide", wide_pair / "target", wide_pair / "draft", "greedy")
    return write_llmapi_repo(spec, tmp_path_factory.mktemp("llmapi-wide"))


@pytest.fixture(scope="module")
def rejection_repo(tmp_path_factory) -> Path:
    spec = pair_spec("pystdlib-prob", DEMO_PAIR / "target", DEMO_PAIR / "draft", "probabilistic")
    repo = write_llmapi_repo(spec, tmp_path_factory.mktemp("llmapi-prob"))
    options = repo / OPTIONS_FILE
    options.write_text(options.read_text() + "enable_iter_perf_stats: true\n")
    return repo


@pytest.fixture(scope="module")
def lookup_repo(tmp_path_factory) -> Path:
    """A prompt-lookup spec of the small target (no draft section): NGram options."""
    spec = yaml.safe_load((EXAMPLES / "pystdlib-demo-lookup.yaml").read_text())
    spec["name"], spec["target"]["model"] = "pystdlib-lookup", str(DEMO_PAIR / "target")
    return write_llmapi_repo(spec, tmp_path_factory.mktemp("llmapi-lookup"))


@pytest.fixture(scope="module")
def lookup(lookup_repo):
    served = Served(lookup_repo)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def exact_match(exact_match_repo):
    served = Served(exact_match_repo)
    yield served
    served.stop()


@pytest.fixture(scope="module")
def rejection(rejection_repo):
    served = Served(rejection_repo)
    yield served
    served.stop()


# --- the target alone ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_target(wide_pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(WIDE_PAIR / "target"), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(wide_pair / "target"))


def greedy_text(target, prompt: str, num_tokens: int = NEW_TOKENS) -> str:
    """The target alone, greedily, with the engines' defaults (conftest.greedy_reference)."""
    return decode(target, greedy_reference(target, prompt, num_tokens))


# --- greedy: the target alone, through the openai SDK --------------------------------------------


def test_the_route_serves_trtllm_serves_endpoints(exact_match):
    assert [model.id for model in exact_match.client.models.list().data] == [MODEL]
    assert exact_match.get("/health")[0] == 200
    # No enable_iter_perf_stats in the written options: trtllm-serve's /metrics is an empty list.
    assert exact_match.get("/metrics") == (200, b"[]")


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_completion_equals_the_target_alone(exact_match, wide_target, stream):
    prompt = prompt_texts(3, 200)[1 + stream]
    options = {"model": MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
    if stream:
        chunks = list(exact_match.client.completions.create(**options, stream=True))
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        speculative = chunks[-1].model_extra["speculative"]
    else:
        response = exact_match.client.completions.create(**options)
        text, speculative = response.choices[0].text, response.model_extra["speculative"]
    assert text == greedy_text(wide_target, prompt)
    assert speculative["total_draft_tokens"] > 0 and speculative["num_target_calls"] < NEW_TOKENS


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_equals_the_target_on_the_templated_prompt(exact_match, wide_target, stream):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def main(argv):"}]
    rendered = wide_target[1].apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    options = {"model": MODEL, "messages": messages, "temperature": 0, "max_completion_tokens": NEW_TOKENS}
    if stream:
        chunks = list(exact_match.client.chat.completions.create(**options, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    else:
        response = exact_match.client.chat.completions.create(**options)
        assert response.choices[0].message.role == "assistant"
        text = response.choices[0].message.content
    assert text == greedy_text(wide_target, rendered)


# --- the verification each route selects -----------------------------------------------------------


def test_ngram_serves_greedy_text_equal_to_the_target_alone(lookup):
    """NGram read back as prompt lookup (no draft model): 10 prompts one by one and 8 at once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(DEMO_PAIR / "target"), dtype=torch.float32).eval()
    target = model, AutoTokenizer.from_pretrained(str(DEMO_PAIR / "target"))
    parameters = lookup.loop_parameters()
    assert parameters["method"] == "prompt_lookup" and parameters["lookup_max_ngram"] == "3"
    prompts = ["def read_text(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef read_bytes(path):\n"]
    prompts += prompt_texts(9, 200)

    def complete(prompt: str):
        return lookup.client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0)

    drafted = 0
    for prompt in prompts:
        response = complete(prompt)
        assert response.choices[0].text == greedy_text(target, prompt)
        drafted += response.model_extra["speculative"]["total_draft_tokens"]
    assert drafted > 0
    with ThreadPoolExecutor(8) as pool:
        texts = [r.choices[0].text for r in pool.map(complete, prompts[:8])]
    assert texts == [greedy_text(target, prompt) for prompt in prompts[:8]]


def test_1_3_without_rejection_sampling_verifies_sampled_drafts_by_token_match(exact_match):
    parameters = exact_match.loop_parameters()
    assert parameters["use_draft_logits"] == "false" and parameters["sampled_token_match"] == "true"
    # Sampled requests speculate (a plain torch repository without draft logits would decode them plainly).
    response = exact_match.client.completions.create(
        model=MODEL, prompt="def read(path):\n", max_tokens=12, temperature=0.8, seed=5
    )
    assert response.model_extra["speculative"]["total_draft_tokens"] > 0


def test_1_3_with_rejection_sampling_verifies_with_the_drafts_logits(rejection):
    parameters = rejection.loop_parameters()
    assert parameters["use_draft_logits"] == "true" and parameters["sampled_token_match"] == "false"


def test_each_line_and_option_selects_its_verification(tmp_path):
    spec = pair_spec("pystdlib", DEMO_PAIR / "target", DEMO_PAIR / "draft", "greedy")
    expected = {
        ("greedy", "1.3"): "token_match",
        ("probabilistic", "1.3"): "rejection_sampling",
        ("greedy", "1.2"): "rejection_sampling",  # 1.2.x: two-model, the draft's logits kept
    }
    for (acceptance, version), verification in expected.items():
        spec["speculative"]["acceptance"] = acceptance
        root = tmp_path / f"{acceptance}-{version}"
        root.mkdir()
        route = twin_route(write_llmapi_repo(spec, root, "--trtllm-version", version))
        assert route.sampled_verification == verification, (acceptance, version)
        assert route.server == f"trtllm-serve, TensorRT-LLM {llm_args.VERSION_LABELS[version]}"
        assert (route.spec.num_draft_tokens, route.model_name, route.port) == (4, MODEL, 8000)
        assert route.spec.triton.flavor == "torch" and route.spec.engine.max_seq_len == 1008


def test_the_line_and_port_come_from_the_command(tmp_path):
    spec = pair_spec("pystdlib", DEMO_PAIR / "target", DEMO_PAIR / "draft", "greedy")
    repo = write_llmapi_repo(spec, tmp_path, "--trtllm-version", "1.2")
    command = repo / COMMAND_FILE
    command.write_text(command.read_text().replace("--port 8000", "--port 9100"))
    options = repo / OPTIONS_FILE
    options.write_text(options.read_text().replace("TensorRT-LLM 1.2.x", "TensorRT-LLM 1.3+"))
    route = twin_route(repo)  # trtllm-serve.sh's --extra_llm_api_options says 1.2.x, whatever the header
    assert route.port == 9100 and route.server.endswith("1.2.x")
    command.unlink()  # without the command: the header's line, the target from model.yaml
    assert twin_route(repo).server.endswith("1.3+") and twin_route(repo).model_name == MODEL
    assert twin_route(tmp_path) is None  # not an llmapi repository: Triton serves it as written


# --- refused as the LLM API refuses ------------------------------------------------------------------


def test_a_misspelled_key_is_refused_by_name_before_anything_starts(exact_match_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(exact_match_repo, repo)
    options = repo / OPTIONS_FILE
    options.write_text(options.read_text().replace("  max_draft_len: 4", "  max_draft_lenn: 4"))
    argv = [TRT_SPEC, "serve", "--repo", str(repo), "--openai-port", str(free_port())]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and not result.stdout
    assert (
        "speculative_config.max_draft_lenn: unknown key for TensorRT-LLM 1.3+; did you mean max_draft_len?"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    with pytest.raises(LlmArgsError) as caught:
        twin_route(repo)
    assert caught.value.key_path == "speculative_config.max_draft_lenn"


def test_a_key_of_the_other_line_is_refused(tmp_path):
    spec = pair_spec("pystdlib", DEMO_PAIR / "target", DEMO_PAIR / "draft", "greedy")
    repo = write_llmapi_repo(spec, tmp_path, "--trtllm-version", "1.2")
    options = repo / OPTIONS_FILE
    options.write_text(options.read_text() + "  use_rejection_sampling: true\n")
    with pytest.raises(LlmArgsError, match="it is TensorRT-LLM 1.3\\+'s, not 1.2.x's"):
        twin_route(repo)


# --- sampled: distributed as the target's ------------------------------------------------------------


@pytest.mark.parametrize("route", ["rejection", "exact_match", "lookup"])
def test_sampled_completions_follow_the_target_distribution(route, request, wide_pair):
    # rejection sampling on the small pair (use_rejection_sampling: true), exact token match on the
    # demo pair (1.3+ without it), and NGram's point masses by exact token match on the small
    # target: each must give the target's distribution.
    served: Served = request.getfixturevalue(route)
    pair = wide_pair if route == "exact_match" else DEMO_PAIR
    prompt = LOOKUP_PROMPT if route == "lookup" else PROMPT

    def run(indices: range) -> list[tuple[str, int, int]]:
        results = []
        for index in indices:
            response = served.client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=2,
                temperature=SAMPLING.temperature,
                top_p=SAMPLING.top_p,
                presence_penalty=PENALTIES.presence_penalty,
                seed=index,
                extra_body={"top_k": SAMPLING.top_k, "repetition_penalty": PENALTIES.repetition_penalty},
            )
            speculative = response.model_extra["speculative"]
            results.append(
                (
                    response.choices[0].text,
                    speculative["total_draft_tokens"],
                    speculative["total_accepted_draft_tokens"],
                )
            )
        return results

    served.get("/metrics")  # from now on
    with ThreadPoolExecutor(CLIENTS) as pool:
        chunks = [range(start, NUM_REQUESTS, CLIENTS) for start in range(CLIENTS)]
        results = [result for chunk in pool.map(run, chunks) for result in chunk]
    drafted, accepted = sum(r[1] for r in results), sum(r[2] for r in results)
    assert drafted >= NUM_REQUESTS and 0 < accepted < drafted  # every request verified a draft

    expected = two_token_distribution(pair / "target", prompt, SAMPLING, PENALTIES, DEMO_EOS)
    counts = Counter(text for text, _, _ in results)
    unexpected = sum(count for text, count in counts.items() if text not in expected)
    assert unexpected <= 0.01 * NUM_REQUESTS, {t: c for t, c in counts.items() if t not in expected}
    for text, p in expected.items():
        if p >= 0.01:
            sigma = (NUM_REQUESTS * p * (1 - p)) ** 0.5
            assert abs(counts[text] - NUM_REQUESTS * p) <= 6 * sigma, (text, counts[text], NUM_REQUESTS * p)
    z = chi_square_z(counts, expected, NUM_REQUESTS)
    # The negative control: the same samples are far from the draft's own distribution, so the
    # bound can fail (a server that emitted the draft's tokens would).
    z_draft = chi_square_z(
        counts, two_token_distribution(pair / "draft", prompt, SAMPLING, PENALTIES, DEMO_EOS), NUM_REQUESTS
    )
    print(f"{route}: chi-square z {z:.2f} against the target, {z_draft:.1f} against the draft")
    assert z <= 6 < z_draft, (z, z_draft)
    if route != "rejection":
        return

    # /metrics (enable_iter_perf_stats: true): the loop's work since the last call, in upstream's keys.
    # The loop counts a request when it ends, which may be just after its last response went out.
    entries: list[dict] = []
    deadline = time.monotonic() + 10
    while sum(entry["numCompletedRequests"] for entry in entries) < NUM_REQUESTS and time.monotonic() < deadline:
        status, body = served.get("/metrics")
        assert status == 200
        entries += json.loads(body)
        time.sleep(0.1)
    assert sum(entry["numCompletedRequests"] for entry in entries) == NUM_REQUESTS
    stats = [entry["specDecodingStats"] for entry in entries]
    assert sum(s["numDraftTokens"] for s in stats) == drafted
    assert sum(s["numAcceptedTokens"] for s in stats) == accepted
    assert all(s["acceptanceLength"] > 1 and s["numRequestsWithDraftTokens"] > 0 for s in stats)
    assert json.loads(served.get("/metrics")[1]) == []  # nothing since


def test_loop_counters_read_prometheus_text():
    text = (
        "# HELP trt_spec_loop_draft_tokens_total Draft tokens proposed\n"
        'trt_spec_loop_draft_tokens_total{model="spec_loop"} 12\n'
        'trt_spec_loop_requests_total{model="spec_loop",outcome="finished"} 3\n'
        'trt_spec_loop_requests_total{model="spec_loop",outcome="failed"} 1\n'
        'nv_inference_count{model="spec_loop",version="1"} 9\n'
    )
    counters = loop_counters(text)
    assert counters["draft_tokens"] == 12 and counters["finished"] == 3 and counters["iterations"] == 0
