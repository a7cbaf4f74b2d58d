#!/usr/bin/env python3
"""What the OpenAI-compatible endpoint costs per token, next to gRPC streaming, in one run.

The same packaged prompts (``trt_spec.bench.prompts.prompt_texts``) are streamed greedily, with
the same ``max_tokens``, through both paths of one ``trt-spec serve --openai-port`` process:

- grpc: the ensemble over a gRPC bidirectional stream per request (``grpc.aio``; the request
  the endpoint itself sends, without HTTP);
- openai: ``POST /v1/completions`` with ``stream: true`` through the ``openai`` SDK's async
  client (server-sent events).

Per concurrency (default 1 and 8), rounds alternate the two paths (grpc first in odd rounds,
openai first in even ones) so drift on a busy machine hits both. Printed per path: generated
tokens per second (all requests' tokens / wall time of the batch), time to first token, and the
ratio; ``cost`` = grpc tok/s / openai tok/s - 1, the extra time per token of the OpenAI path. The
texts of both paths are compared too (greedy: they must be equal).

    trt-spec serve --repo model_repo --openai-port 8080 &
    python scripts/openai_vs_grpc.py --grpc-url 127.0.0.1:8001 --openai-url http://127.0.0.1:8080/v1

    python scripts/openai_vs_grpc.py --repo model_repo     # starts (and stops) trt-spec serve itself
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trt_spec.bench.prompts import PROMPT_CHARS, prompt_texts
from trt_spec.serving.openai import EnsembleBackend, EnsembleRequest, load_tokenizer, tokenizer_dir_of
from trt_spec.serving.server import free_port


@dataclass
class Result:
    text: str
    tokens: int
    ttft_s: float


async def grpc_one(backend: EnsembleBackend, prompt: str, max_tokens: int) -> Result:
    start = time.perf_counter()
    ttft, parts, tokens = None, [], 0
    async for piece in backend.generate(EnsembleRequest(prompt=prompt, max_tokens=max_tokens, stream=True)):
        ttft = ttft if ttft is not None else time.perf_counter() - start
        parts.append(piece.text)
        if piece.usage is not None:
            tokens = piece.usage.completion_tokens
    return Result("".join(parts), tokens, ttft or 0.0)


async def openai_one(client, model: str, prompt: str, max_tokens: int) -> Result:
    start = time.perf_counter()
    ttft, parts, tokens = None, [], 0
    stream = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices:
            ttft = ttft if ttft is not None else time.perf_counter() - start
            parts.append(chunk.choices[0].text)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return Result("".join(parts), tokens, ttft or 0.0)


async def batch(run, prompts: list[str], concurrency: int) -> tuple[list[Result], float]:
    """All prompts, at most ``concurrency`` in flight; the results and the wall time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> Result:
        async with gate:
            return await run(prompt)

    start = time.perf_counter()
    results = await asyncio.gather(*(one(prompt) for prompt in prompts))
    return list(results), time.perf_counter() - start


async def measure(args: argparse.Namespace, grpc_url: str, openai_url: str) -> list[dict]:
    import openai

    client = openai.AsyncOpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    tokenizer = load_tokenizer(tokenizer_dir_of(args.repo)) if args.repo else None
    backend = EnsembleBackend(grpc_url, tokenizer)
    await backend.start()
    rows = []
    try:
        for concurrency in args.concurrency:
            prompts = prompt_texts(args.prompts, args.prompt_chars)
            prompts = (prompts * (1 + (concurrency * 2) // len(prompts)))[: max(len(prompts), concurrency * 2)]
            paths = {
                "grpc": lambda prompt: grpc_one(backend, prompt, args.max_tokens),
                "openai": lambda prompt: openai_one(client, model, prompt, args.max_tokens),
            }
            await batch(paths["grpc"], prompts[:concurrency], concurrency)  # warm-up, not counted
            await batch(paths["openai"], prompts[:concurrency], concurrency)
            seen: dict[str, list[tuple[list[Result], float]]] = {"grpc": [], "openai": []}
            for round_index in range(args.rounds):
                order = ("grpc", "openai") if round_index % 2 == 0 else ("openai", "grpc")
                for path in order:
                    seen[path].append(await batch(paths[path], prompts, concurrency))
            row: dict = {"concurrency": concurrency, "requests": len(prompts), "rounds": args.rounds}
            for path, batches in seen.items():
                tokens = sum(result.tokens for results, _ in batches for result in results)
                wall = sum(seconds for _, seconds in batches)
                row[f"{path}_tokens_per_s"] = tokens / wall
                row[f"{path}_ttft_ms"] = 1000 * statistics.median(r.ttft_s for results, _ in batches for r in results)
                row[f"{path}_tokens"] = tokens
            row["openai_over_grpc"] = row["openai_tokens_per_s"] / row["grpc_tokens_per_s"]
            row["cost_per_token"] = row["grpc_tokens_per_s"] / row["openai_tokens_per_s"] - 1
            row["same_text"] = all(
                [r.text for r in grpc_results] == [r.text for r in openai_results]
                for (grpc_results, _), (openai_results, _) in zip(seen["grpc"], seen["openai"])
            )
            rows.append(row)
            print(
                f"concurrency {concurrency:>2}: grpc {row['grpc_tokens_per_s']:7.1f} tok/s "
                f"(TTFT {row['grpc_ttft_ms']:6.1f} ms)  openai {row['openai_tokens_per_s']:7.1f} tok/s "
                f"(TTFT {row['openai_ttft_ms']:6.1f} ms)  openai/grpc {row['openai_over_grpc']:.3f}  "
                f"cost/token {100 * row['cost_per_token']:+.1f}%  same text: {row['same_text']}",
                flush=True,
            )
    finally:
        await backend.close()
        await client.close()
    return rows


def start_serve(repo: str) -> tuple[subprocess.Popen, str, str]:
    """``trt-spec serve --repo REPO --openai-port P`` on free ports; its gRPC and OpenAI addresses."""
    ports = [free_port() for _ in range(4)]
    argv = [str(Path(sys.executable).parent / "trt-spec"), "serve", "--repo", repo]
    argv += ["--grpc-port", str(ports[0]), "--http-port", str(ports[1]), "--metrics-port", str(ports[2])]
    argv += ["--openai-port", str(ports[3])]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line.startswith("ready "):
        process.wait()
        raise SystemExit(f"trt-spec serve did not start (exit code {process.returncode})")
    fields = dict(field.split("=", 1) for field in line.split()[1:])
    return process, fields["grpc"], fields["openai"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", help="start `trt-spec serve --openai-port` on this repository (free ports)")
    parser.add_argument("--grpc-url", help="a running server's gRPC address, H:P")
    parser.add_argument("--openai-url", help="its OpenAI endpoint, http://H:P/v1")
    parser.add_argument("--model", help="the endpoint's model name (default: the one /v1/models lists)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-chars", type=int, default=PROMPT_CHARS)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="batches per path and concurrency (alternating)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON at the end")
    args = parser.parse_args()
    if not args.repo and not (args.grpc_url and args.openai_url):
        parser.error("give --repo, or both --grpc-url and --openai-url")
    process = None
    try:
        if args.repo:
            process, grpc_url, openai_url = start_serve(args.repo)
        else:
            grpc_url, openai_url = args.grpc_url, args.openai_url
        rows = asyncio.run(measure(args, grpc_url, openai_url))
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
