"""`trt-spec generate --local` runs the engine code the torch flavor serves: on the demo pair it
emits what the served loop (the loop model's driver over the twin engine models, with the inputs
preprocessing resolves) emits, also on a prompt whose first greedy token is EOS, where
TensorRT-LLM's ``min_tokens`` = 1 default decides the answer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import DEMO_EOS, DEMO_PAIR
from test_twin_engine import LocalEngines, loop_inputs, loop_parameters

from trt_spec.cli import main
from trt_spec.runtime import bls
from trt_spec.runtime.loop import GenerationParams
from trt_spec.runtime.penalties import ENGINE_MIN_TOKENS
from trt_spec.runtime.twin_engine import TwinEngine
from trt_spec.twin import TwinPair

K = 3
NEW_TOKENS = 12
# Endings of a Python file: after them the demo target's most likely next token is EOS.
CANDIDATES = (
    'if __name__ == "__main__":\n    unittest.main()\n',
    "if __name__ == '__main__':\n    main()\n",
    '\n\n\nif __name__ == "__main__":\n    test_main()\n',
    "    test_main()\n",
)


@pytest.fixture(scope="module")
def pair():
    return TwinPair.from_dirs(DEMO_PAIR / "target", DEMO_PAIR / "draft")


@pytest.fixture(scope="module")
def eos_first(pair) -> str:
    """A prompt whose first greedy token, by the target alone, is EOS."""
    for text in CANDIDATES:
        with torch.inference_mode():
            logits = pair.target.model(torch.tensor([pair.encode(text)])).logits[0, -1]
        if int(logits.argmax()) == DEMO_EOS:
            return text
    pytest.fail(f"none of the candidate prompts starts its greedy continuation with EOS: {CANDIDATES}")


def served(pair: TwinPair, prompt: list[int], max_tokens: int = NEW_TOKENS, k: int = K) -> list[int]:
    """What the torch flavor's loop model emits: the loop's driver over the two engine models, with
    preprocessing's defaults (end_id the tokenizer's EOS, min_tokens TensorRT-LLM's 1)."""
    engines = LocalEngines(
        *(
            TwinEngine(engine.fork(), role, max_draft_len=K, max_seq_len=1024, cache_slots=2)
            for engine, role in ((pair.target, "target"), (pair.draft, "draft"))
        )
    )
    inputs = loop_inputs(prompt, max_tokens, k=k, end_id=pair.tokenizer.eos_token_id, min_tokens=ENGINE_MIN_TOKENS)
    settings = loop_parameters(K)
    state = asyncio.run(bls.run_loop(bls.read_loop_request(inputs, settings), settings, engines))
    return state.output


def write_spec(tmp_path):
    spec = tmp_path / "demo.yaml"
    spec.write_text(
        f"name: demo\ntarget:\n  model: {DEMO_PAIR / 'target'}\ndraft:\n  model: {DEMO_PAIR / 'draft'}\n"
        f"speculative:\n  num_draft_tokens: {K}\n"
    )
    return spec


@pytest.mark.parametrize("k", [0, K])
def test_in_process_equals_the_served_loop_when_the_first_greedy_token_is_eos(pair, eos_first, k):
    prompt = pair.encode(eos_first)
    expected = served(pair, prompt, k=k)
    assert expected and DEMO_EOS not in expected[:1]  # min_tokens 1: EOS is not the first token
    params = GenerationParams(max_new_tokens=NEW_TOKENS, num_draft_tokens=k, eos_token_ids=pair.eos_token_ids)
    generation = pair.generate(prompt, params)
    assert generation.run() == expected


def test_cli_generate_local_prints_what_the_server_emits(pair, eos_first, tmp_path):
    expected = pair.tokenizer.decode(served(pair, pair.encode(eos_first)))
    result = CliRunner().invoke(
        main, ["generate", "--local", "--spec", str(write_spec(tmp_path)), "--max-tokens", str(NEW_TOKENS), eos_first]
    )
    assert result.exit_code == 0, result.output
    assert expected.strip() and result.stdout == expected + "\n"


def test_a_request_level_min_tokens_holds_eos_back_across_calls(pair, eos_first):
    """min_tokens beyond the first call: each engine call gets what is left of the request's minimum,
    as the loop model sends it; the served and in-process loops agree token for token."""
    from trt_spec.runtime.penalties import Penalties

    prompt = pair.encode(eos_first)
    engines = LocalEngines(
        *(
            TwinEngine(engine.fork(), role, max_draft_len=K, max_seq_len=1024, cache_slots=2)
            for engine, role in ((pair.target, "target"), (pair.draft, "draft"))
        )
    )
    inputs = loop_inputs(prompt, 2 * NEW_TOKENS, k=K, end_id=DEMO_EOS, min_tokens=NEW_TOKENS)
    settings = loop_parameters(K)
    state = asyncio.run(bls.run_loop(bls.read_loop_request(inputs, settings), settings, engines))
    sent = [int(call["min_tokens"][0, 0]) for _, call in engines.calls]
    assert sent[0] == NEW_TOKENS and sent[-1] < NEW_TOKENS  # the minimum shrinks call by call
    params = GenerationParams(max_new_tokens=2 * NEW_TOKENS, num_draft_tokens=K, eos_token_ids=pair.eos_token_ids)
    generation = pair.generate(prompt, params, penalties=Penalties(min_tokens=NEW_TOKENS))
    assert generation.run() == state.output
    assert len(state.output) >= NEW_TOKENS and np.all(np.array(state.output[:NEW_TOKENS]) != DEMO_EOS)
