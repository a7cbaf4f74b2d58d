"""The loop under TensorRT-LLM's scheduler, in-process: the loop model's logic (``bls.run_loop``)
over the backend emulator, with concurrent requests reaching each engine as one batch, as Triton's
dynamic batcher hands them over. Under load the executor discards drafts (``fitDraftTokens``); a
loop that read "every token is a draft" as the target's end of sequence (the old inference: no
``total_draft_tokens``) ends requests early, the loop that asks the target how many drafts it
verified does not. Greedy on the demo pair: every request equals the target alone."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import numpy as np
import pytest
import torch
from conftest import DEMO_EOS, DEMO_PAIR, greedy_reference
from test_twin_engine import loop_inputs, loop_parameters

from trt_spec.bench.prompts import prompt_texts
from trt_spec.runtime import bls
from trt_spec.runtime import tensors as T
from trt_spec.runtime.torch_engine import TorchCausalLM
from trt_spec.runtime.trtllm_emulator import BackendError, BatchItem, EngineFacts, TrtllmBackendEmulator

K = 4
NEW_TOKENS = 64
NUM_REQUESTS = 6
# A step of 192 tokens and blocks of 8: six ~60-token contexts never fit one step, and a last
# chunk has room for only what is left of its block, so drafts are discarded in most steps.
LOADED = {"max_num_tokens": 192, "tokens_per_block": 8}


class BatchingEngines:
    """bls.EngineClient over emulators: the calls that are pending at once go to their engine as
    one batch (Triton's dynamic batcher with no queue delay does the same). ``hide_verified``
    drops ``total_draft_tokens`` from the target's answers: the loop as it was before it read it."""

    def __init__(self, emulators: dict[str, TrtllmBackendEmulator], *, hide_verified: bool = False):
        self.emulators = emulators
        self.hide_verified = hide_verified
        self.pending: dict[str, list] = defaultdict(list)
        self.batch_sizes: list[int] = []
        self.discarded = 0

    async def infer(self, model, inputs, outputs):
        future = asyncio.get_running_loop().create_future()
        if not any(self.pending.values()):
            asyncio.get_running_loop().call_soon(self._flush)  # after every ready request has queued
        self.pending[model].append((BatchItem(inputs, outputs), future))
        return await future

    def _flush(self) -> None:
        pending, self.pending = self.pending, defaultdict(list)
        for model, calls in pending.items():
            self.batch_sizes.append(len(calls))
            results = self.emulators[model].execute_batch([item for item, _ in calls])
            for (item, future), result in zip(calls, results):
                if isinstance(result, BackendError):
                    future.set_exception(bls.EngineCallError(f"{model}: {result}"))
                    continue
                if model == T.TARGET and T.DRAFT_INPUT_IDS.name in item.inputs:
                    sent = item.inputs[T.DRAFT_INPUT_IDS.name].size
                    self.discarded += sent - int(result[T.ENGINE_TOTAL_DRAFT_TOKENS.name].reshape(-1)[0])
                    if self.hide_verified:
                        result = {k: v for k, v in result.items() if k != T.ENGINE_TOTAL_DRAFT_TOKENS.name}
                future.set_result(result)


@pytest.fixture(scope="module")
def pair_models():
    return {role: TorchCausalLM.from_pretrained(str(DEMO_PAIR / role)) for role in ("target", "draft")}


def emulators(written_configs, pair_models, **limits) -> dict[str, TrtllmBackendEmulator]:
    engines = {}
    for name, role in ((T.TARGET, "target"), (T.DRAFT, "draft")):
        facts = EngineFacts(
            role=role,
            hf_model_dir=str(DEMO_PAIR / role),
            max_batch_size=8,
            max_input_len=1007,
            max_seq_len=1008 + (K if role == "target" else 0),
            max_draft_len=K if role == "target" else 0,
            vocab_size=pair_models[role].vocab_size,
            gather_generation_logits=False,
            **limits,
        )
        model = pair_models[role].fork()  # own KV caches
        engines[name] = TrtllmBackendEmulator.load(written_configs[role], facts, model=model)
    return engines


@pytest.fixture(scope="module")
def prompts(target):
    return [list(target[1](text)["input_ids"]) for text in prompt_texts(NUM_REQUESTS, 240)]


def run_together(engines: BatchingEngines, prompts: list[list[int]]) -> list:
    settings = loop_parameters(K)
    requests = [bls.read_loop_request(loop_inputs(p, NEW_TOKENS, k=K, end_id=DEMO_EOS), settings) for p in prompts]

    async def all_requests():
        return await asyncio.gather(*(bls.run_loop(request, settings, engines) for request in requests))

    torch.set_num_threads(1)
    return asyncio.run(all_requests())


def test_under_load_drafts_are_discarded_and_every_request_still_equals_the_target_alone(
    written_configs, pair_models, prompts, target
):
    engines = BatchingEngines(emulators(written_configs, pair_models, **LOADED))
    states = run_together(engines, prompts)
    assert max(engines.batch_sizes) == NUM_REQUESTS  # the requests really were scheduled together
    assert engines.discarded > 0  # and the scheduler discarded drafts
    texts = prompt_texts(NUM_REQUESTS, 240)
    for text, state in zip(texts, states):
        assert state.output == greedy_reference(target, text, NEW_TOKENS)
        assert state.finish_reason in ("length", "eos")


def test_negative_control_the_old_inference_ends_requests_early_under_the_same_load(
    written_configs, pair_models, prompts, target
):
    engines = BatchingEngines(emulators(written_configs, pair_models, **LOADED), hide_verified=True)
    states = run_together(engines, prompts)
    texts = prompt_texts(NUM_REQUESTS, 240)
    references = [greedy_reference(target, text, NEW_TOKENS) for text in texts]
    truncated = [s for s, r in zip(states, references) if s.output != r]
    assert truncated, "no request was cut short: this control cannot show the fix"
    for state, reference in zip(states, references):
        assert reference[: len(state.output)] == state.output  # cut short, never wrong
    assert all(s.finish_reason == "eos" and len(s.output) < NEW_TOKENS for s in truncated)


def test_a_lone_request_keeps_every_draft(written_configs, pair_models, prompts, target):
    engines = BatchingEngines(emulators(written_configs, pair_models))  # the plan's limits
    states = run_together(engines, prompts[:1])
    assert engines.discarded == 0
    assert states[0].output == greedy_reference(target, prompt_texts(1, 240)[0], NEW_TOKENS)


def test_backend_reports_the_drafts_it_verified(written_configs, pair_models, prompts):
    emulator = emulators(written_configs, pair_models, **LOADED)[T.TARGET]
    call = {
        T.INPUT_IDS.name: np.array([prompts[0]], dtype=np.int32),
        T.INPUT_LENGTHS.name: np.array([[len(prompts[0])]], dtype=np.int32),
        T.REQUEST_OUTPUT_LEN.name: np.array([[K + 1]], dtype=np.int32),
        T.DRAFT_INPUT_IDS.name: np.array([[1, 2, 3, 4]], dtype=np.int32),
        T.RETURN_PERF_METRICS.name: np.array([[True]], dtype=bool),
    }
    names = [T.OUTPUT_IDS.name, T.SEQUENCE_LENGTH.name, T.ENGINE_TOTAL_DRAFT_TOKENS.name]
    alone = emulator.execute(call, names)
    assert int(alone[T.ENGINE_TOTAL_DRAFT_TOKENS.name][0, 0]) == K
    assert emulator.execute({**call, T.RETURN_PERF_METRICS.name: np.array([[False]])}, names).keys() == {
        T.OUTPUT_IDS.name,
        T.SEQUENCE_LENGTH.name,
    }
