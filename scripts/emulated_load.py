#!/usr/bin/env python3
"""Long and concurrent requests on the tensorrtllm flavor, through the real (CPU) Triton server
with its engine models in the TensorRT-LLM backend emulator: how many target calls had drafts
discarded by the emulated executor's scheduler, and that every request still ran to max_seq_len.

The demo pair, a spec with max_input_len 480 and max_seq_len 640 (the one the tests use), prompts
of 450 tokens (packaged Python sources joined), each asking for what is left to max_seq_len;
greedy. Printed per concurrency: tokens, wall time, drafts verified and accepted, target calls,
the calls whose drafts the scheduler discarded (the backend's "Discarding N draft tokens" lines).

    python scripts/emulated_load.py
    python scripts/emulated_load.py --concurrency 1 --concurrency 8 --acceptance probabilistic
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoTokenizer

from trt_spec.bench.long_sequences import MAX_SEQ_LEN, long_prompts, long_sequence_spec
from trt_spec.client import SpecClient
from trt_spec.repository.writer import write_repository
from trt_spec.serving.emulation import emulated_repository
from trt_spec.serving.server import TritonServer

PAIR = Path(__file__).resolve().parents[1] / "examples" / "pystdlib-pair"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, action="append", help="requests at once (repeatable; 1 and 8)")
    parser.add_argument("--acceptance", choices=("greedy", "probabilistic"), default="greedy")
    args = parser.parse_args()
    levels = args.concurrency or [1, 8]
    spec = long_sequence_spec(PAIR, args.acceptance)
    tokenizer = AutoTokenizer.from_pretrained(str(PAIR / "target"))
    prompts = [
        (prompt, MAX_SEQ_LEN - len(tokenizer(prompt)["input_ids"])) for prompt in long_prompts(tokenizer, max(levels))
    ]
    root = Path(tempfile.mkdtemp(prefix="emulated-load-"))
    repo = write_repository(spec, root / "repo", "tensorrtllm").path
    with TritonServer(emulated_repository(repo, spec, root / "served"), ready_timeout_s=240) as server:

        def run(case: tuple[str, int]):
            prompt, max_tokens = case
            with SpecClient(server.grpc_url, timeout_s=600) as client:
                events = list(client.generate(prompt, max_tokens=max_tokens))
            return events[-1]

        for level in levels:
            before = server.log_path.read_text().count("Discarding")
            started = time.perf_counter()
            with ThreadPoolExecutor(level) as pool:
                lasts = list(pool.map(run, prompts[:level]))
            seconds = time.perf_counter() - started
            discarded = server.log_path.read_text().count("Discarding") - before
            print(
                f"concurrency {level}: {sum(last.num_output_tokens for last in lasts)} tokens in {seconds:.1f} s; "
                f"drafts verified {sum(last.total_draft_tokens for last in lasts)}, accepted "
                f"{sum(last.total_accepted_draft_tokens for last in lasts)}; target calls "
                f"{sum(last.num_target_calls for last in lasts)}, of which with drafts discarded {discarded}; "
                f"output lengths {[last.num_output_tokens for last in lasts]}"
            )


if __name__ == "__main__":
    main()
