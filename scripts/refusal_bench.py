#!/usr/bin/env python3
"""How fast an oversized prompt is refused, through each protocol, and what it costs a bystander.

Starts ``trt-spec serve`` on the small demo pair (torch flavor, its OpenAI endpoint too), then for
gRPC (the ensemble, tritonclient), HTTP (Triton's ``/v2/models/ensemble/generate``) and the
OpenAI endpoint (``POST /v1/completions``) sends, ``--rounds`` times each:

- an 8 MB prompt (``--megabytes``): refused, since no ``max_input_len`` of tokens can hold it;
- a small bad request (``max_tokens`` 0): the cheapest refusal the protocol gives, the baseline;
- a greedy 24-token request alone, and the same beside the 8 MB prompt (a bystander).

Prints the median (and fastest) time to each refusal and the bystander's median alone and beside,
with their ratio: the goal is every 8 MB refusal under 100 ms and bystanders within 20%.

    python scripts/refusal_bench.py --rounds 5 --json refusals.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from peer_bench import serving  # this directory's: a server process for a block's duration

ROOT = Path(__file__).resolve().parent.parent
TRT_SPEC_CLI = str(Path(sys.executable).parent / "trt-spec")
SPEC = ROOT / "examples" / "pystdlib-demo.yaml"
BYSTANDER_PROMPT = "def read_config(path):\n    settings = {}\n"
BYSTANDER_TOKENS = 24


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _grpc_inputs(prompt: bytes, max_tokens: int) -> list:
    inputs = []
    for name, array in (
        ("text_input", np.array([[prompt]], dtype=object)),
        ("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
    ):
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class Protocols:
    """One request per protocol: (refused?, detail) for a hostile one; text for a greedy one."""

    def __init__(self, grpc_url: str, http_url: str, openai_url: str, model: str):
        self.grpc_url, self.http_url, self.openai_url, self.model = grpc_url, http_url, openai_url, model

    def grpc(self, prompt: bytes, max_tokens: int) -> tuple[bool, str]:
        # The ensemble is decoupled (it streams), so gRPC clients use the bidirectional stream.
        answers: queue.Queue = queue.Queue()
        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            client.start_stream(callback=lambda result, error: answers.put(error))
            try:
                client.async_stream_infer("ensemble", _grpc_inputs(prompt, max_tokens))
                error = answers.get(timeout=120)
            finally:
                client.stop_stream()
        return (True, error.message()) if error is not None else (False, "answered")

    def http(self, prompt: bytes, max_tokens: int) -> tuple[bool, str]:
        body = json.dumps({"text_input": prompt.decode(), "max_tokens": max_tokens}).encode()
        status, answer = _post(f"{self.http_url}/v2/models/ensemble/generate", body)
        return status >= 400, f"{status} {answer[:160].decode(errors='replace')}"

    def openai(self, prompt: bytes, max_tokens: int) -> tuple[bool, str]:
        body = json.dumps({"model": self.model, "prompt": prompt.decode(), "max_tokens": max_tokens}).encode()
        status, answer = _post(f"{self.openai_url}/completions", body)
        return status >= 400, f"{status} {answer[:160].decode(errors='replace')}"

    def bystander(self) -> float:
        body = {"model": self.model, "prompt": BYSTANDER_PROMPT, "max_tokens": BYSTANDER_TOKENS, "temperature": 0}
        started = time.perf_counter()
        status, answer = _post(f"{self.openai_url}/completions", json.dumps(body).encode())
        if status != 200:
            raise SystemExit(f"the bystander failed: {status} {answer[:200]!r}")
        return time.perf_counter() - started


def _timed(send: Callable[[], tuple[bool, str]]) -> tuple[float, bool, str]:
    started = time.perf_counter()
    refused, detail = send()
    return time.perf_counter() - started, refused, detail


def measure(protocols: Protocols, name: str, huge: bytes, rounds: int) -> dict:
    send = getattr(protocols, name)
    big, small, alone, beside, details = [], [], [], [], {}
    for _ in range(rounds):  # interleaved: a drift of the shared machine hits every figure alike
        seconds, refused, detail = _timed(lambda: send(b"def f():", 0))
        if not refused:
            raise SystemExit(f"{name}: max_tokens 0 was not refused")
        small.append(seconds)
        details["small"] = detail
        alone.append(protocols.bystander())
        with ThreadPoolExecutor(1) as pool:
            hostile = pool.submit(_timed, lambda: send(huge, 8))
            time.sleep(0.005)  # the big request first on the wire
            beside.append(protocols.bystander())
            seconds, refused, detail = hostile.result()
        if not refused:
            raise SystemExit(f"{name}: the {len(huge)}-byte prompt was answered")
        big.append(seconds)
        details["big"] = detail
    return {
        "protocol": name,
        "prompt_bytes": len(huge),
        "big_refused_ms_median": 1000 * statistics.median(big),
        "big_refused_ms_min": 1000 * min(big),
        "small_refused_ms_median": 1000 * statistics.median(small),
        "bystander_alone_s_median": statistics.median(alone),
        "bystander_beside_s_median": statistics.median(beside),
        "bystander_ratio": statistics.median(beside) / statistics.median(alone),
        "messages": details,
    }


def wait_ready(process: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"trt-spec serve exited with {process.returncode}; see {log}")
        if any(line.startswith("ready ") for line in log.read_text().splitlines()):
            return
        time.sleep(0.5)
    raise SystemExit(f"trt-spec serve was not ready after {timeout_s:.0f} s; see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--megabytes", type=float, default=8.0)
    parser.add_argument("--port", type=int, default=18700, help="first of four ports (gRPC, HTTP, metrics, OpenAI)")
    parser.add_argument(
        "--protocols", nargs="+", choices=("grpc", "http", "openai"), default=["grpc", "http", "openai"]
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()

    line = b"x = 1\n"
    huge = line * int(args.megabytes * 1024 * 1024 / len(line))
    grpc_port, http_port, metrics_port, openai_port = (args.port + offset for offset in range(4))
    with tempfile.TemporaryDirectory(prefix="refusal-bench-") as tmp:
        repo, log = Path(tmp) / "repo", Path(tmp) / "serve.log"
        subprocess.run(
            [TRT_SPEC_CLI, "repo", "--spec", str(SPEC), "-o", str(repo)], check=True, stdout=subprocess.DEVNULL
        )
        argv = [TRT_SPEC_CLI, "serve", "--repo", str(repo), "--grpc-port", str(grpc_port),
                "--http-port", str(http_port), "--metrics-port", str(metrics_port),
                "--openai-port", str(openai_port)]  # fmt: skip
        with serving(argv, dict(os.environ), log) as process:
            wait_ready(process, log)
            models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{openai_port}/v1/models", timeout=10))
            protocols = Protocols(
                f"127.0.0.1:{grpc_port}",
                f"http://127.0.0.1:{http_port}",
                f"http://127.0.0.1:{openai_port}/v1",
                models["data"][0]["id"],
            )
            protocols.bystander()  # warm
            rows = []
            for name in args.protocols:
                row = measure(protocols, name, huge, args.rounds)
                rows.append(row)
                print(
                    f"{name:6s} {len(huge) / 2**20:.0f} MiB refused in {row['big_refused_ms_median']:6.1f} ms "
                    f"(fastest {row['big_refused_ms_min']:.1f}); max_tokens 0 in {row['small_refused_ms_median']:5.1f} ms; "
                    f"bystander {row['bystander_alone_s_median']:.3f} s alone, {row['bystander_beside_s_median']:.3f} s "
                    f"beside (x{row['bystander_ratio']:.2f})",
                    flush=True,
                )
                print(f"       refusal: {row['messages']['big'][:150]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "rounds": args.rounds}, indent=2))


if __name__ == "__main__":
    main()
