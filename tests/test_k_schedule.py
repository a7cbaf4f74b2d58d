"""K that follows load: the loop model's K schedule by requests in flight.

The schedule (``LoopParameters.k_schedule``: K for 1, 2, ... requests in flight, 0 = plain
decoding) caps the K of requests that send no ``num_draft_tokens``; a request that sends one keeps
it. Here: the parameters and their config round trip, the repository settings and the flavors'
schedules, preprocessing's flag, the cap in ``LoopState`` and ``bls.run_loop`` over in-process
engines, and end to end through the emulated tensorrtllm flavor on the CPU Triton server, read
back from ``trt_spec_loop_scheduled_steps_total``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import threading
import time
import urllib.request
from collections import Counter

import numpy as np
import pytest
from conftest import EXAMPLES, decode, greedy_reference, parsed_parameters
from test_twin import PROMPT
from test_twin_engine import LocalEngines, loop_inputs, loop_parameters, models, twin_engines  # noqa: F401

from trt_spec.plan import make_plan
from trt_spec.plan.projection import DEFAULT_ALPHA, ScheduleStep, k_schedule, loop_schedule
from trt_spec.repository import configs, flavors
from trt_spec.runtime import bls
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import AcceptanceProfile, StepCosts
from trt_spec.runtime.errors import ModelParametersError
from trt_spec.runtime.loop import AdaptiveDraftLength, GenerationParams, LoopState
from trt_spec.runtime.parameters import NO_PRIOR_ALPHA, LoopParameters, PreprocessingParameters
from trt_spec.runtime.preprocess import check_parameters
from trt_spec.spec import load_spec

SCHEDULE = (4, 4, 2, 2, 0, 0, 0, 0)  # the demo spec: K 4, max_batch_size 8
SPEC_FILE = EXAMPLES / "pystdlib-demo.yaml"


def scheduled(schedule=SCHEDULE, **overrides) -> LoopParameters:
    return dataclasses.replace(loop_parameters(), k_schedule=LoopParameters.schedule_text(schedule), **overrides)


# --- the parameters ------------------------------------------------------------------------------


def test_scheduled_k_by_requests_in_flight():
    settings = scheduled((4, 2, 0))
    assert settings.schedule == (4, 2, 0)
    assert [settings.scheduled_k(n) for n in (0, 1, 2, 3, 4, 50)] == [4, 4, 2, 0, 0, 0]  # the last beyond
    assert loop_parameters().schedule == () and loop_parameters().scheduled_k(5) is None
    assert loop_parameters().prior is None


def test_loop_parameters_round_trip_the_schedule_and_the_prior():
    for settings in (scheduled(prior_alpha=0.63), loop_parameters()):
        config = {"name": T.LOOP, "parameters": settings.to_config()}
        assert LoopParameters.from_config(config) == settings
    config = scheduled(prior_alpha=0.63).to_config()
    assert config["k_schedule"] == {"string_value": "4,4,2,2,0,0,0,0"}
    assert config["prior_alpha"] == {"string_value": "0.63"}
    # No schedule and no prior: "" (protobuf's JSON may leave an empty string out) and a negative alpha.
    empty = loop_parameters().to_config()
    assert empty["prior_alpha"] == {"string_value": str(NO_PRIOR_ALPHA)}
    empty["k_schedule"] = {}
    assert LoopParameters.from_config({"name": T.LOOP, "parameters": empty}).schedule == ()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("k_schedule", "4,x", "comma-separated integers"),
        ("k_schedule", "4,5", r"0\.\.max_draft_len 4"),
        ("k_schedule", "4,-1", r"0\.\.max_draft_len 4"),
        ("prior_alpha", "1.5", r"prior_alpha must be in \[0, 1\]"),
        ("prior_profile", "0.6,x", "prior_profile must be comma-separated fractions"),
        ("prior_profile", "0.6,0.5", "needs the prior_alpha"),
    ],
)
def test_a_bad_schedule_or_prior_fails_the_load_naming_it(key, value, message):
    parameters = {**loop_parameters().to_config(), key: {"string_value": value}}
    with pytest.raises(ModelParametersError, match=message):
        LoopParameters.from_config({"name": T.LOOP, "parameters": parameters})


def test_an_old_repository_without_the_new_keys_is_told_to_rewrite():
    parameters = {k: v for k, v in loop_parameters().to_config().items() if k != "k_schedule"}
    with pytest.raises(ModelParametersError, match=r"no parameter 'k_schedule'.*trt-spec repo --spec F"):
        LoopParameters.from_config({"name": T.LOOP, "parameters": parameters})


# --- the repository --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan():
    return make_plan(load_spec(SPEC_FILE))


def _loop_parameters(settings: configs.RepositorySettings) -> LoopParameters:
    return parsed_parameters(LoopParameters, configs.loop_config(settings))


def test_the_loop_keeps_the_specs_k_until_load_lowers_the_projected_best():
    """The spec's K is the user's (check --tuning questions it); the schedule changes K only where
    load moves the projected best below its value for one request, and to 0 where nothing pays."""
    steps = [ScheduleStep(n, k, 1.5) for n, k in enumerate((3, 3, 2, 1, 0, 0), start=1)]
    assert loop_schedule(steps, spec_k=4) == (4, 4, 2, 1, 0, 0)
    assert loop_schedule(steps, spec_k=2) == (2, 2, 2, 1, 0, 0)
    assert (
        loop_schedule([ScheduleStep(1, 0, 1.0), ScheduleStep(2, 0, 1.0)], spec_k=4) == ()
    )  # never pays: the spec's call


def test_the_tensorrtllm_flavor_writes_the_projections_schedule(plan):
    settings = flavors.settings_from_plan(plan, flavor="tensorrtllm")
    expected = loop_schedule(k_schedule(plan, DEFAULT_ALPHA), plan.spec.num_draft_tokens)
    assert settings.k_schedule == expected and len(expected) == plan.spec.engine.max_batch_size
    assert expected[0] == plan.spec.num_draft_tokens  # one request in flight: the spec's K
    assert settings.step_costs.prior_alpha is None
    loop = _loop_parameters(settings)
    assert loop.schedule == expected and loop.prior is None


def test_the_torch_flavor_writes_no_schedule(plan):
    settings = flavors.settings_from_plan(plan, flavor="torch", acceptance=0.55)
    assert settings.k_schedule == () and _loop_parameters(settings).schedule == ()
    assert _loop_parameters(settings).prior == 0.55


def test_a_measured_acceptance_makes_the_schedule_and_the_prior(plan):
    profile = AcceptanceProfile((0.9, 0.8, 0.7, 0.6), alpha=0.82)
    settings = flavors.settings_from_plan(plan, flavor="tensorrtllm", acceptance=profile)
    assert settings.k_schedule == flavors.get("tensorrtllm").k_schedule(plan, profile)
    assert settings.step_costs.prior_alpha == 0.82
    assert _loop_parameters(settings).prior == 0.82


def test_step_costs_and_schedule_overrides(plan):
    costs = StepCosts(draft=0.2, verify_slope=0.05)
    settings = flavors.settings_from_plan(
        plan, flavor="tensorrtllm", step_costs=costs, acceptance=0.7, k_schedule=SCHEDULE
    )
    assert settings.step_costs == StepCosts(0.2, 0.05, prior_alpha=0.7)
    assert settings.k_schedule == SCHEDULE
    loop = _loop_parameters(settings)
    assert (loop.draft_cost, loop.verify_slope, loop.prior, loop.schedule) == (0.2, 0.05, 0.7, SCHEDULE)
    assert flavors.settings_from_plan(plan, flavor="tensorrtllm", k_schedule=()).k_schedule == ()


@pytest.mark.parametrize("schedule", [(4, 5), (4,) * 9, (-1,)])
def test_a_schedule_that_does_not_fit_the_engines_is_refused(plan, schedule):
    with pytest.raises(configs.RepositoryError, match="k_schedule"):
        flavors.settings_from_plan(plan, flavor="tensorrtllm", k_schedule=schedule)


# --- preprocessing's flag ---------------------------------------------------------------------------


LIMITS = PreprocessingParameters(
    tokenizer_dir="tokenizer",
    add_special_tokens=True,
    max_input_len=64,
    max_seq_len=128,
    max_draft_len=4,
    default_num_draft_tokens=4,
    vocab_size=100,
    exclude_input_in_output=True,
    draft_logits=False,
)


def test_preprocessing_flags_a_request_that_sent_no_num_draft_tokens():
    default = check_parameters({T.MAX_TOKENS.name: 8}, LIMITS)
    assert (default.num_draft_tokens, default.num_draft_tokens_is_default) == (4, True)
    for k in (0, 4, 2):
        sent = check_parameters({T.MAX_TOKENS.name: 8, T.NUM_DRAFT_TOKENS.name: k}, LIMITS)
        assert (sent.num_draft_tokens, sent.num_draft_tokens_is_default) == (k, False)


# --- the loop's logic -------------------------------------------------------------------------------


def test_loop_state_caps_k():
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4))
    assert [state.next_num_draft_tokens(cap) for cap in (None, 6, 4, 2, 0)] == [4, 4, 4, 2, 0]
    adaptive = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=4, adaptive_draft=True))
    wanted = adaptive.next_num_draft_tokens()
    assert adaptive.next_num_draft_tokens(wanted - 1) == wanted - 1 and adaptive.next_num_draft_tokens(0) == 0


def test_a_step_without_drafts_is_no_observation_for_adaptive_k():
    costs = StepCosts(draft=0.1, verify_slope=0.02, prior_alpha=0.9)
    state = LoopState(
        PROMPT, GenerationParams(max_new_tokens=50, num_draft_tokens=4, adaptive_draft=True, step_costs=costs)
    )
    adaptive = state._adaptive
    assert isinstance(adaptive, AdaptiveDraftLength)
    before = (adaptive.alpha, adaptive._decided)
    for step in range(5):
        state.commit([], [10 + step])  # plain steps (the schedule's K 0)
    assert (adaptive.alpha, adaptive._decided) == before and state.stats.drafted_tokens == 0
    state.commit([7, 8], [7, 9])  # one accepted, one rejected: an observation
    assert adaptive.alpha != before[0]


def _run(models, inputs, settings, in_flight):  # noqa: F811 - models: test_twin_engine's fixture
    engines = LocalEngines(*twin_engines(models))
    times = bls.LoopTimes()
    request = bls.read_loop_request(inputs, settings)
    state = asyncio.run(bls.run_loop(request, settings, engines, times=times, in_flight=in_flight))
    drafts = [int(call[T.REQUEST_OUTPUT_LEN.name].reshape(-1)[0]) for model, call in engines.calls if model == T.DRAFT]
    return state, drafts, times


def _default(inputs):
    """As preprocessing hands a request that sent no num_draft_tokens."""
    return {**inputs, T.NUM_DRAFT_TOKENS_IS_DEFAULT.name: np.array([[True]])}


@pytest.mark.parametrize(("in_flight", "cap"), [(1, 4), (2, 4), (3, 2), (4, 2), (5, 0), (8, 0), (20, 0)])
def test_a_default_request_drafts_at_most_the_scheduled_k(models, in_flight, cap):  # noqa: F811
    plain, _, _ = _run(models, loop_inputs(PROMPT, k=0), loop_parameters(), None)
    state, drafts, times = _run(models, _default(loop_inputs(PROMPT)), scheduled(), lambda: in_flight)
    assert state.output == plain.output  # greedy: any K gives the target's tokens
    assert drafts and all(k <= cap for k in drafts) if cap else drafts == []
    if cap:
        assert Counter(drafts).most_common(1)[0][0] == cap
    assert sum(times.steps_by_load.values()) == state.stats.iterations
    assert {n for n, _ in times.steps_by_load} == {in_flight}
    assert all(k <= cap for _, k in times.steps_by_load)


def _target_output_lens(models, inputs, settings, in_flight):  # noqa: F811
    engines = LocalEngines(*twin_engines(models))
    request = bls.read_loop_request(inputs, settings)
    state = asyncio.run(bls.run_loop(request, settings, engines, in_flight=in_flight))
    lens = [int(call[T.REQUEST_OUTPUT_LEN.name].reshape(-1)[0]) for model, call in engines.calls if model == T.TARGET]
    return state, lens


def test_plain_calls_ask_for_many_tokens_when_none_is_awaited_alone(models, monkeypatch):  # noqa: F811
    monkeypatch.setattr(bls, "PLAIN_CHUNK_UNDER_LOAD", 16)
    alone, ones = _target_output_lens(models, loop_inputs(PROMPT, k=0, max_tokens=40), loop_parameters(), None)
    assert ones == [1] * 40  # streamed: one token per call, as each is sent
    whole, lens = _target_output_lens(
        models, loop_inputs(PROMPT, k=0, max_tokens=40, stream=False), loop_parameters(), None
    )
    assert lens == [40] and whole.output == alone.output  # plain, not streamed: one call for all
    # A default request the schedule holds at K 0: chunks, the load looked at again after each.
    state, lens = _target_output_lens(
        models, _default(loop_inputs(PROMPT, max_tokens=40, stream=False)), scheduled(), lambda: 8
    )
    assert lens == [16, 16, 8]
    assert state.output == alone.output and state.finish_reason == "length"


def test_a_plain_answer_shorter_than_asked_ends_the_request():
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=0))
    assert state.commit([], [5, 6, 7], plain_len=8) == [5, 6, 7]
    assert state.finish_reason == "eos"  # the target stopped (end_id left out of its output)
    state = LoopState(PROMPT, GenerationParams(max_new_tokens=20, num_draft_tokens=0))
    assert state.commit([], [5, 6, 7], plain_len=3) == [5, 6, 7] and not state.finished
    with pytest.raises(ValueError, match="plain_len"):
        state.commit([], [5], plain_len=0)


def test_an_explicit_k_is_kept_under_load(models):  # noqa: F811
    state, drafts, times = _run(models, loop_inputs(PROMPT, k=3), scheduled(), lambda: 8)
    assert drafts and max(drafts) == 3 and state.stats.drafted_tokens > 0
    assert times.steps_by_load.get((8, 3), 0) > 0
    # The flag false (sent explicitly) reads the same as absent.
    explicit = {**loop_inputs(PROMPT, k=3), T.NUM_DRAFT_TOKENS_IS_DEFAULT.name: np.array([[False]])}
    assert _run(models, explicit, scheduled(), lambda: 8)[1] == drafts


def test_without_a_count_of_requests_in_flight_no_schedule_applies(models):  # noqa: F811
    state, drafts, times = _run(models, _default(loop_inputs(PROMPT)), scheduled(), None)
    assert max(drafts) == 4 and times.steps_by_load == {}


def test_an_adaptive_default_request_is_capped_too(models):  # noqa: F811
    inputs = _default(loop_inputs(PROMPT, adaptive=True))
    _, drafts, _ = _run(models, inputs, scheduled(), lambda: 3)
    assert drafts and max(drafts) <= 2
    _, none, _ = _run(models, inputs, scheduled(), lambda: 6)
    assert none == []


def test_concurrent_requests_follow_the_count_in_flight(models):  # noqa: F811
    """Requests admitted together, counted as the loop model counts them (running in run_loop)."""
    engines = LocalEngines(*twin_engines(models, cache_slots=8))
    settings = scheduled()
    active = 0
    prompts = [[*PROMPT[: 3 + i], 11 + i] for i in range(6)]

    async def one(prompt, times):
        nonlocal active
        active += 1
        try:
            request = bls.read_loop_request(_default(loop_inputs(prompt)), settings)
            return await bls.run_loop(request, settings, engines, times=times, in_flight=lambda: active)
        finally:
            active -= 1

    times = [bls.LoopTimes() for _ in prompts]

    async def all_of_them():
        return await asyncio.gather(*(one(prompt, t) for prompt, t in zip(prompts, times)))

    states = asyncio.run(all_of_them())
    steps = Counter()
    for t in times:
        steps.update(t.steps_by_load)
    assert all(k <= SCHEDULE[min(n, len(SCHEDULE)) - 1] for n, k in steps)
    assert any(n >= 5 and k == 0 for n, k in steps)  # six together: plain decoding
    plain = [_run(models, loop_inputs(prompt, k=0), loop_parameters(), None)[0].output for prompt in prompts]
    assert [state.output for state in states] == plain


# --- end to end: the emulated tensorrtllm flavor on the CPU Triton server ---------------------------

NEW_TOKENS = 40
STEPS = re.compile(r"^trt_spec_loop_scheduled_steps_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("pytriton", reason="the CPU Triton server comes with nvidia-pytriton")
    from trt_spec.repository.writer import write_repository
    from trt_spec.serving.emulation import emulated_repository
    from trt_spec.serving.server import TritonServer

    spec = load_spec(SPEC_FILE)
    root = tmp_path_factory.mktemp("k_schedule")
    cwd = os.getcwd()
    os.chdir(root)  # the spec's relative paths.engines: no engines are built there
    try:
        repo = write_repository(spec, root / "repo", "tensorrtllm", k_schedule=SCHEDULE).path
    finally:
        os.chdir(cwd)
    running = TritonServer(emulated_repository(repo, spec, root / "served"), ready_timeout_s=240).start()
    try:
        _until_metrics_answer(running)
        yield running
    finally:
        running.stop()


def _until_metrics_answer(server, timeout_s: float = 30) -> None:
    """Triton starts its metrics server after the HTTP one: wait for it before the first scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(server.metrics_url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def scheduled_steps(server) -> Counter:
    """``trt_spec_loop_scheduled_steps_total`` by (in_flight, k)."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    steps: Counter = Counter()
    for match in STEPS.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        steps[(int(labels["in_flight"]), int(labels["k"]))] += int(float(match["value"]))
    return steps


def steps_since(server, before: Counter, results: list[list]) -> Counter:
    """The steps the requests of ``results`` added: one per target call of each. The loop records a
    request's metrics after sending its last response, so they may trail it a moment."""
    expected = sum(events[-1].num_target_calls for events in results)
    deadline = time.monotonic() + 10
    while True:
        steps = scheduled_steps(server) - before
        if sum(steps.values()) >= expected or time.monotonic() > deadline:
            assert sum(steps.values()) == expected, steps
            return steps
        time.sleep(0.05)


def generate_together(server, requests: list[tuple[str, dict]]) -> list[list]:
    """Each (prompt, options) on its own client, started together; each request's events."""
    from trt_spec.client import SpecClient

    results: list = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def one(index, prompt, options):
        with SpecClient(server.grpc_url) as client:
            start.wait()
            results[index] = list(client.generate(prompt, max_tokens=NEW_TOKENS, **options))

    threads = [threading.Thread(target=one, args=(i, *request)) for i, request in enumerate(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert all(result is not None for result in results)
    return results


@pytest.fixture(scope="module")
def texts():
    from trt_spec.bench.prompts import prompt_texts

    return prompt_texts(8, 200)


def _check_exact(target, prompt, events):
    reference = greedy_reference(target, prompt, NEW_TOKENS)
    assert "".join(event.text for event in events) == decode(target, reference)
    assert events[-1].num_output_tokens == len(reference)


def _within_schedule(steps: Counter) -> bool:
    return all(k <= SCHEDULE[min(n, len(SCHEDULE)) - 1] for (n, k), count in steps.items() if count)


def test_served_a_lone_request_runs_at_the_first_k(server, target, texts):
    before = scheduled_steps(server)
    (events,) = generate_together(server, [(texts[0], {})])
    steps = steps_since(server, before, [events])
    _check_exact(target, texts[0], events)
    assert steps and {n for n, _ in steps} == {1}
    assert steps[(1, 4)] > 0
    # Only the last steps, near max_tokens, draft fewer (a step never passes max_tokens).
    assert sum(count for (_, k), count in steps.items() if k != 4) <= 4


def test_served_eight_together_follow_the_schedule_and_stay_exact(server, target, texts):
    before = scheduled_steps(server)
    results = generate_together(server, [(text, {}) for text in texts])
    steps = steps_since(server, before, results)
    for text, events in zip(texts, results):
        _check_exact(target, text, events)
    assert _within_schedule(steps), steps
    assert sum(count for (n, k), count in steps.items() if n >= 5 and k == 0) > 0, steps
    assert max(n for n, _ in steps) >= 5


def test_served_an_explicit_k_is_kept_under_load(server, target, texts):
    before = scheduled_steps(server)
    requests = [(text, {}) for text in texts[:7]] + [(texts[7], {"num_draft_tokens": 3})]
    results = generate_together(server, requests)
    steps = steps_since(server, before, results)
    for (text, _), events in zip(requests, results):
        _check_exact(target, text, events)
    # Under load the schedule's K is 0; K 3 there is the explicit request's own.
    assert sum(count for (n, k), count in steps.items() if n >= 5 and k == 3) > 0, steps
    assert results[7][-1].total_draft_tokens > 0
    assert not any(count for (n, k), count in steps.items() if n >= 5 and k == 4), steps  # 4: nobody's there
