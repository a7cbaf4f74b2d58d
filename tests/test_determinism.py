"""Greedy output does not depend on machine load: adaptive K is chosen from fixed step costs and
the acceptance history alone (``trt_spec/runtime/costs.py``), so the same request runs the same K
sequence, the same verification widths and the same float arithmetic under any load."""

from __future__ import annotations

import subprocess
import sys

from conftest import EXAMPLES

from trt_spec.runtime.loop import GenerationParams
from trt_spec.spec import load_spec
from trt_spec.twin import TwinPair

RUNS = 10


def test_the_same_greedy_request_gives_the_same_tokens_while_the_cpu_is_loaded():
    pair = TwinPair.from_spec(load_spec(EXAMPLES / "pystdlib-demo.yaml"))
    prompt = pair.encode("def parse_args(argv):\n    ")
    params = GenerationParams(
        max_new_tokens=64,
        num_draft_tokens=8,
        adaptive_draft=True,
        eos_token_ids=pair.eos_token_ids,
        step_costs=pair.step_costs(),
    )
    # Two busy processes on the 2-core machine: step times now differ from an idle run's.
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        runs = []
        for _ in range(RUNS):
            generation = pair.generate(prompt, params)
            output = generation.run()
            stats = generation.stats
            runs.append((tuple(output), stats.target_calls, stats.drafted_tokens, stats.accepted_tokens))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert len(set(runs)) == 1, f"{len(set(runs))} different outcomes in {RUNS} runs"
    assert runs[0][2] > 0 and len(runs[0][0]) == 64
