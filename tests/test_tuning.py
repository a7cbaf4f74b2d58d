"""`trt-spec tune` (trt_spec/bench/tuning.py) and its report (trt_spec/plan/tuning.py): acceptance
measured per draft position on the user's prompts, the projection fed that profile, the
recommendation, and the report read by plan, check, repo and bench --local."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import CHAT, CODE, EXAMPLES, parsed_parameters

from trt_spec.bench.tuning import render_report
from trt_spec.cli import main
from trt_spec.errors import SpecError
from trt_spec.plan import make_plan
from trt_spec.plan.projection import project_plan
from trt_spec.plan.tuning import TuningReport, load_tuning
from trt_spec.runtime.costs import AcceptanceProfile, StepCosts, expected_tokens_per_call
from trt_spec.runtime.errors import GenerationParamsError
from trt_spec.runtime.loop import AdaptiveDraftLength
from trt_spec.spec import load_spec

DEMO_SPEC = EXAMPLES / "pystdlib-demo.yaml"

# --- the profile ---------------------------------------------------------------------------------


def test_a_geometric_profile_is_the_iid_formula():
    alpha = 0.7
    profile = AcceptanceProfile(tuple(alpha**i for i in range(1, 7)), alpha)
    for k in range(1, 7):
        assert profile.tokens_per_call(k) == pytest.approx(expected_tokens_per_call(alpha, k))


def test_a_profile_that_falls_faster_than_alpha_gives_fewer_tokens():
    """Acceptance measured by position is not alpha^i: a profile dropping faster projects fewer
    tokens per call, so a smaller K (what the i.i.d. guess would miss)."""
    plan = make_plan(load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml"))
    steep = AcceptanceProfile((0.8, 0.4, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005), alpha=0.8)
    iid = project_plan(plan, 0.8)
    measured = project_plan(plan, steep)
    assert measured.rows[-1].tokens_per_target_call < iid.rows[-1].tokens_per_target_call
    assert measured.recommended_k < iid.recommended_k
    assert measured.to_json()["acceptance_profile"] == list(steep.accepted_through)


def test_profiles_are_checked_and_made_monotone():
    with pytest.raises(ValueError, match="at least one"):
        AcceptanceProfile((), 0.5)
    with pytest.raises(ValueError, match="cannot exceed"):
        AcceptanceProfile((0.5, 0.6), 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        AcceptanceProfile((1.5,), 0.5)
    assert AcceptanceProfile.measured([0.5, 0.51, 0.2], 0.5).accepted_through == (0.5, 0.5, 0.2)
    with pytest.raises(ValueError, match="up to K = 2"):
        AcceptanceProfile((0.5, 0.2), 0.5).tokens_per_call(3)


def test_adaptive_k_starts_from_a_measured_prior():
    """Without a prior adaptive K starts at alpha 0.5; with a measured one it starts there, weighed
    as a steady state, so one early rejection does not swing it."""
    uninformed = AdaptiveDraftLength(8, StepCosts(draft=0.1, verify_slope=0.0))
    informed = AdaptiveDraftLength(8, StepCosts(draft=0.1, verify_slope=0.0, prior_alpha=0.9))
    assert uninformed.alpha == 0.5
    assert informed.alpha == pytest.approx(0.9)
    assert informed.next_num_draft_tokens() > uninformed.next_num_draft_tokens()
    informed.update(num_drafted=8, num_accepted=0)
    assert informed.alpha > 0.75


# The wide pair on the packaged Python prompts (trt-spec tune, 4 x 64 tokens, 2026-12-04): drafts
# past the first hold better than alpha^i says (position 4 given 3: 0.96).
WIDE_PROFILE = (0.6533, 0.52, 0.3836, 0.3699, 0.1806, 0.1739, 0.0882, 0.0735)
WIDE_COSTS = StepCosts(draft=0.1131, verify_slope=0.0340, prior_alpha=0.7247)


def test_a_measured_profile_gives_adaptive_k_its_shape():
    profiled = dataclasses.replace(WIDE_COSTS, prior_profile=WIDE_PROFILE)
    profile = AcceptanceProfile(WIDE_PROFILE, 0.7247)
    # At the prior the profile's own E(K); the i.i.d. form at the same alpha misses its shape.
    for k in range(1, 9):
        assert profiled.tokens_per_call(0.7247, k) == pytest.approx(profile.tokens_per_call(k))
    assert WIDE_COSTS.tokens_per_call(0.7247, 4) == pytest.approx(expected_tokens_per_call(0.7247, 4))
    # Past the profile, its last conditional acceptance; a request running below the prior gets less.
    last = WIDE_PROFILE[-1] / WIDE_PROFILE[-2]
    assert profiled.tokens_per_call(0.7247, 9) == pytest.approx(profile.tokens_per_call(8) + WIDE_PROFILE[-1] * last)
    assert profiled.tokens_per_call(0.5, 4) < profiled.tokens_per_call(0.7247, 4)
    # The K each picks as a request's running acceptance wanders around the prior (0.6-0.75 seen):
    # the i.i.d. form flips between 3, 4 and 5, the profile stays at 4 (bench --local measured K 4
    # fastest: 1.73-1.90x against K 3's 1.63-1.74x, docs/measurements.md).
    for alpha, picks in ((0.68, (3, 4)), (0.7247, (4, 4)), (0.8, (5, 4))):
        assert max(range(1, 9), key=lambda k: WIDE_COSTS.speedup(alpha, k)) == picks[0]
        assert max(range(1, 9), key=lambda k: profiled.speedup(alpha, k)) == picks[1]
    shaped = AdaptiveDraftLength(8, profiled)
    assert shaped.next_num_draft_tokens() == 4
    # A longer memory with the profile: two early rejections leave K where the profile put it.
    for _ in range(2):
        shaped.update(num_drafted=4, num_accepted=0)
    assert shaped.next_num_draft_tokens() == 4
    with pytest.raises(GenerationParamsError, match="prior_profile needs the prior_alpha"):
        StepCosts(draft=0.1, verify_slope=0.0, prior_profile=WIDE_PROFILE)
    with pytest.raises(GenerationParamsError, match="cannot exceed"):
        StepCosts(draft=0.1, verify_slope=0.0, prior_alpha=0.7, prior_profile=(0.5, 0.6))


# --- the command and its report ----------------------------------------------------------------


def _tune(spec: Path, dataset: Path, output: Path, *methods: str) -> TuningReport:
    plot = output.with_suffix(".png")
    args = ["tune", "--spec", str(spec), "--dataset", str(dataset), "--prompts", "4", "-k", "1", "-k", "2", "-k", "4"]
    args += ["--max-tokens", "24", "--threads", "1", "-o", str(output), "--plot", str(plot)]
    args += [arg for method in methods for arg in ("--method", method)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"wrote {output}" in result.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")
    return load_tuning(output, load_spec(spec))


@pytest.fixture(scope="module")
def reports(chat_spec, tmp_path_factory) -> dict[str, Path]:
    """Tuning reports of the small pair on Python code (its training domain) and English chat."""
    root = tmp_path_factory.mktemp("tuning")
    paths = {"code": root / "code.json", "chat": root / "chat.json"}
    _tune(chat_spec, CODE, paths["code"], "draft_target")
    _tune(chat_spec, CHAT, paths["chat"], "draft_target")
    return paths


def test_two_workloads_measure_their_own_acceptance_and_recommended_k(reports, chat_spec):
    code, chat = (load_tuning(reports[name]) for name in ("code", "chat"))
    for report in (code, chat):
        result = report.primary
        assert [row.k for row in result.rows] == [1, 2, 4]
        assert len(result.accepted_through) == 4 == len(result.projected_speedup)
        assert report.workload.prompts == 4
        # E from the profile measured at K 4 against tokens per call measured at K 4 itself: equal
        # but for steps cut short by max_tokens (the profile counts drafts, not emitted tokens).
        at_4 = result.rows[-1]
        assert at_4.profile_tokens_per_target_call == pytest.approx(at_4.tokens_per_target_call, abs=0.25)
    print(
        f"\ncode: alpha {code.primary.alpha:.3f}, accepted through {code.primary.accepted_through}, "
        f"K {code.best_k}; chat: alpha {chat.primary.alpha:.3f}, {chat.primary.accepted_through}, "
        f"K {chat.best_k}"
    )
    # Measured (4 prompts x 24 tokens, greedy): code ~0.44 of drafts accepted, chat all of them (the
    # pair falls into repeating "#\n" on English): different profiles, and the projection on the
    # spec's H100 picks a different K for each.
    assert chat.primary.alpha - code.primary.alpha > 0.2
    assert chat.best_k > code.best_k
    assert [(r.recommended_method, r.recommended_k) for r in (code, chat)] == [
        ("draft_target", code.best_k),
        ("draft_target", chat.best_k),
    ]  # the one method measured


def test_plan_projects_from_the_report(reports, chat_spec):
    result = CliRunner().invoke(main, ["plan", "--spec", str(chat_spec), "--tuning", str(reports["code"]), "--json"])
    assert result.exit_code == 0, result.output
    projection = json.loads(result.stdout)["projection"]
    report = load_tuning(reports["code"])
    assert projection["acceptance_profile"] == report.primary.accepted_through
    assert projection["recommended_k"] == report.best_k
    text = CliRunner().invoke(main, ["plan", "--spec", str(chat_spec), "--tuning", str(reports["code"])]).stdout
    assert "acceptance measured by trt-spec tune" in text
    both = CliRunner().invoke(
        main, ["plan", "--spec", str(chat_spec), "--tuning", str(reports["code"]), "--alpha", "0.5"]
    )
    assert both.exit_code == 2 and "alternatives" in both.output


def test_check_warns_when_the_specs_k_is_off_the_recommendation(reports, chat_spec, tmp_path):
    report = load_tuning(reports["code"])
    spec = load_spec(chat_spec)
    assert spec.num_draft_tokens != report.best_k  # the demo spec's K 4 against the code workload's
    result = CliRunner().invoke(main, ["check", "--spec", str(chat_spec), "--tuning", str(reports["code"])])
    assert result.exit_code == 0, result.output  # a warning, not fatal
    line = next(line for line in result.stdout.splitlines() if line.startswith("tuning"))
    assert "warn" in line and f"recommends K = {report.best_k} for draft_target" in line and "fixed at build" in line
    # The same spec with the recommended K: no warning.
    matching = tmp_path / "spec.yaml"
    matching.write_text(
        chat_spec.read_text().replace(
            f"num_draft_tokens: {spec.num_draft_tokens}", f"num_draft_tokens: {report.best_k}"
        )
    )
    result = CliRunner().invoke(main, ["check", "--spec", str(matching), "--tuning", str(reports["code"])])
    line = next(line for line in result.stdout.splitlines() if line.startswith("tuning"))
    assert "ok" in line and "warn" not in line


def test_a_bad_report_is_one_clear_error(reports, tmp_path):
    spec = load_spec(DEMO_SPEC)
    with pytest.raises(SpecError, match="does not exist; write it with `trt-spec tune"):
        load_tuning(tmp_path / "missing.json", spec)
    broken = tmp_path / "broken.json"
    data = json.loads(reports["code"].read_text())
    data["methods"][0]["temperatures"][0]["recommended_k"] = 9
    broken.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="recommended_k 9 is outside 1..4"):
        load_tuning(broken)
    broken.write_text(reports["code"].read_text()[:100])
    with pytest.raises(SpecError, match="broken.json"):
        load_tuning(broken)
    other = load_spec(EXAMPLES / "llama8b-1b-h200.yaml")
    with pytest.raises(SpecError, match="not the spec's"):
        load_tuning(reports["code"], other)
    result = CliRunner().invoke(main, ["plan", "--spec", str(DEMO_SPEC), "--tuning", str(broken)])
    assert result.exit_code == 1 and "broken.json" in result.output and "Traceback" not in result.output


def test_repo_starts_adaptive_k_from_the_report(reports, chat_spec, tmp_path):
    """torch flavor: the measured prior and step costs in the loop's config; tensorrtllm: the prior
    and the K schedule projected from the measured profile."""
    from trt_spec.repository.configs import read_config
    from trt_spec.runtime import tensors as T
    from trt_spec.runtime.parameters import LoopParameters

    report = load_tuning(reports["code"])

    def loop_of(flavor: str) -> LoopParameters:
        out = tmp_path / flavor
        args = ["repo", "--spec", str(chat_spec), "--flavor", flavor, "-o", str(out), "--tuning", str(reports["code"])]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        return parsed_parameters(LoopParameters, read_config(out / T.LOOP / "config.pbtxt"))

    torch_loop = loop_of("torch")
    assert torch_loop.prior == pytest.approx(report.primary.alpha, abs=1e-4)
    assert torch_loop.profile == pytest.approx(report.primary.accepted_through, abs=1e-4)
    assert torch_loop.draft_cost == pytest.approx(report.step_costs.draft, abs=1e-4)
    assert torch_loop.schedule == ()
    trtllm_loop = loop_of("tensorrtllm")
    assert trtllm_loop.prior == pytest.approx(report.primary.alpha, abs=1e-4)
    plan = make_plan(load_spec(chat_spec))
    from trt_spec.plan.projection import k_schedule, loop_schedule

    assert trtllm_loop.schedule == loop_schedule(k_schedule(plan, report.acceptance), plan.spec.num_draft_tokens)


# --- every method measured, one recommended ------------------------------------------------------

COPY_HEAVY = EXAMPLES / "copy-heavy.jsonl"


@pytest.fixture(scope="module")
def copy_heavy_report(chat_spec, tmp_path_factory) -> Path:
    """The small pair on the copy-heavy example with every method (its spec has a draft section)."""
    path = tmp_path_factory.mktemp("tuning-methods") / "copy-heavy.json"
    _tune(chat_spec, COPY_HEAVY, path)
    return path


def test_tune_measures_every_method_and_recommends_one(copy_heavy_report, chat_spec):
    report = load_tuning(copy_heavy_report)
    assert [result.name for result in report.methods] == ["draft_target", "hybrid", "prompt_lookup"]
    lookup, hybrid = report.result_of("prompt_lookup").primary, report.result_of("hybrid").primary
    assert lookup.draft_share == 0 and report.result_of("draft_target").primary.draft_share == 1
    assert 0 < hybrid.draft_share < 1  # the draft model ran where lookup found no match
    for result in report.methods:
        row = result.primary.rows[-1]  # K 4: E from the per-step profile is the tokens per call measured
        assert row.profile_tokens_per_target_call == pytest.approx(row.tokens_per_target_call, abs=0.25)
    # Copied text: the lookup's acceptance beats the draft model's, and a method that drafts from the
    # context is recommended, at its own best K.
    best = max(report.methods, key=lambda result: result.primary.best_speedup)
    print("\n" + "\n".join(line for line in render_report(report) if line.startswith("  ") and " K " in line))
    assert report.recommended_method in ("prompt_lookup", "hybrid")
    assert report.result_of(report.recommended_method).primary.best_speedup >= best.primary.best_speedup * 0.99
    assert report.recommended_k == report.result_of(report.recommended_method).primary.recommended_k
    data = json.loads(copy_heavy_report.read_text())
    assert data["recommended_method"] == report.recommended_method and data["recommended_k"] == report.recommended_k


def test_a_report_is_read_for_the_specs_method(copy_heavy_report, chat_spec, tmp_path):
    """check and plan --tuning say when the spec's method is off the recommendation; a report tuned
    on a spec with a draft serves a prompt-lookup spec of the same target."""
    report = load_tuning(copy_heavy_report)
    result = CliRunner().invoke(main, ["check", "--spec", str(chat_spec), "--tuning", str(copy_heavy_report)])
    line = next(line for line in result.stdout.splitlines() if line.startswith("tuning"))
    assert f"recommends {report.recommended_method}" in line and "set speculative.method" in line
    lookup_spec = tmp_path / "lookup.yaml"
    data = yaml.safe_load(chat_spec.read_text())
    del data["draft"]
    data["speculative"]["method"] = "prompt_lookup"
    lookup_spec.write_text(yaml.safe_dump(data))
    assert load_spec(lookup_spec).draft is None
    read = load_tuning(copy_heavy_report, load_spec(lookup_spec))
    assert read.method == "prompt_lookup" and read.primary == report.result_of("prompt_lookup").primary
    plan = CliRunner().invoke(main, ["plan", "--spec", str(lookup_spec), "--tuning", str(copy_heavy_report), "--json"])
    assert plan.exit_code == 0, plan.output
    planned = json.loads(plan.stdout)
    assert planned["projection"]["acceptance_profile"] == read.primary.accepted_through
    assert planned["projection"]["t_d_ms"] == 0  # drafts from the host
    assert planned["tuning"]["recommended_method"] == report.recommended_method
    assert bool(planned["tuning"]["warnings"]) == (report.recommended_method != "prompt_lookup")
    # A report that did not measure the spec's method: one error naming it and the fix.
    lookup_only = tmp_path / "lookup-only.json"
    data = json.loads(copy_heavy_report.read_text())
    data["methods"] = [m for m in data["methods"] if m["name"] == "prompt_lookup"]
    data.update(method="prompt_lookup", recommended_method="prompt_lookup")
    data["recommended_k"] = data["methods"][0]["temperatures"][0]["recommended_k"]
    lookup_only.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="measured prompt_lookup, not speculative.method draft_target"):
        load_tuning(lookup_only, load_spec(chat_spec))
    # A method needing a draft model on a spec without one: refused before anything runs.
    result = CliRunner().invoke(main, ["tune", "--spec", str(lookup_spec), "--method", "hybrid"])
    assert result.exit_code == 2 and "--method hybrid needs a draft model" in result.output


# --- the K schedule measured through a server (tune --url) ---------------------------------------


def test_a_measured_schedule_is_a_step_function_of_load_down_to_plain_decoding():
    from trt_spec.plan.tuning import MeasuredSchedule, SchedulePoint

    def point(in_flight: int, **speedups: float) -> SchedulePoint:
        return SchedulePoint(in_flight=in_flight, speedups={int(k[1:]): v for k, v in speedups.items()})

    measured = MeasuredSchedule(
        url="127.0.0.1:8001",
        method="draft_target",
        temperature=0.0,
        prompts=8,
        max_new_tokens=64,
        points=[point(1, k2=1.3, k4=1.5), point(4, k2=1.2, k4=1.1), point(8, k2=0.9, k4=0.8)],
    )
    assert [p.best_k for p in measured.points] == [4, 2, 0]
    # Loads between those measured take the one below; the spec's K stands where the best is unchanged.
    assert measured.loop_schedule(spec_k=4, max_batch_size=10) == (4, 4, 4, 2, 2, 2, 2, 0, 0, 0)
    # A spec K under the best for one request is the user's call (check warns), kept until load lowers it.
    assert measured.loop_schedule(spec_k=3, max_batch_size=5) == (3, 3, 3, 2, 2)
    lines = measured.render(spec_k=4, max_batch_size=10)
    assert "8 in flight: K 2: x0.90  K 4: x0.80  -> plain decoding" in "\n".join(lines)
    losing = MeasuredSchedule(
        url="u", method="draft_target", temperature=0, prompts=1, max_new_tokens=8, points=[point(1, k4=0.9)]
    )
    assert losing.loop_schedule(spec_k=4, max_batch_size=4) == ()  # nothing measured lowers the spec's K
    # No K paid alone (a noisy figure, or the user's call), but load measured plain decoding faster.
    noisy = MeasuredSchedule(
        url="u",
        method="draft_target",
        temperature=0,
        prompts=1,
        max_new_tokens=8,
        points=[point(1, k4=0.99), point(2, k4=1.1), point(3, k2=0.8, k4=0.7)],
    )
    assert noisy.loop_schedule(spec_k=4, max_batch_size=5) == (4, 4, 0, 0, 0)
    with pytest.raises(ValueError, match="must start at 1 request in flight"):
        MeasuredSchedule(
            url="u", method="draft_target", temperature=0, prompts=1, max_new_tokens=8, points=[point(4, k4=1.2)]
        )


def test_tune_url_fails_at_once_without_a_server():
    from trt_spec.serving.server import free_port

    result = CliRunner().invoke(main, ["tune", "--spec", str(DEMO_SPEC), "--url", f"127.0.0.1:{free_port()}"])
    assert result.exit_code == 1 and "no Triton server answers" in result.output and "tuned" not in result.output
    result = CliRunner().invoke(main, ["tune", "--spec", str(DEMO_SPEC), "--in-flight", "4"])
    assert result.exit_code == 2 and "--in-flight goes with --url" in result.output
    result = CliRunner().invoke(main, ["tune", "--spec", str(DEMO_SPEC), "--no-stream"])
    assert result.exit_code == 2 and "--no-stream goes with --url" in result.output
