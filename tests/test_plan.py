import json
import os

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, ROOT

from trt_spec.checkpoints.config import load_model_info
from trt_spec.cli import main
from trt_spec.errors import ModelConfigError, PlanError
from trt_spec.gpus import GPUS
from trt_spec.plan import make_plan
from trt_spec.plan.memory import GIB, MIB
from trt_spec.spec import load_spec, parse_spec

GOLDEN = ROOT / "tests" / "golden"
EXAMPLE_SPECS = ["llama70b-1b-4xh100.yaml", "llama8b-1b-h200.yaml", "pystdlib-demo.yaml", "pystdlib-demo-lookup.yaml"]


def plan_json(example: str) -> dict:
    text = json.dumps(make_plan(load_spec(EXAMPLES / example)).to_json(), indent=2, sort_keys=True)
    return json.loads(text.replace(str(ROOT), "<root>"))


@pytest.mark.parametrize("example", EXAMPLE_SPECS)
def test_plan_matches_golden(example):
    """The full argv and memory figures of each example are pinned.

    After an intended change: TRT_SPEC_UPDATE_GOLDEN=1 pytest tests/test_plan.py, then review the diff.
    """
    golden = GOLDEN / example.replace(".yaml", ".plan.json")
    actual = plan_json(example)
    if os.environ.get("TRT_SPEC_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(actual, indent=2, sort_keys=True) + "\n")
    assert actual == json.loads(golden.read_text())


def test_target_and_draft_argv_70b():
    plan = make_plan(load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml"))
    target, draft = plan.target.build_argv, plan.draft.build_argv
    assert target[0] == "trtllm-build" and draft[0] == "trtllm-build"

    def flag(argv, name):
        return argv[argv.index(name) + 1]

    assert flag(target, "--speculative_decoding_mode") == "draft_tokens_external"
    assert flag(target, "--max_draft_len") == "5"
    assert "--speculative_decoding_mode" not in draft and "--max_draft_len" not in draft
    for argv, tp in ((target, 4), (draft, 1)):
        assert flag(argv, "--gemm_plugin") == "float16"
        assert flag(argv, "--use_paged_context_fmha") == "enable"
        assert flag(argv, "--max_batch_size") == "8"
        assert flag(argv, "--max_input_len") == "8191"  # the loop resends the sequence: max_seq_len - 1
        assert flag(argv, "--max_seq_len") == "8192"
        assert flag(argv, "--tokens_per_block") == "64"
        assert int(flag(argv, "--max_num_tokens")) >= 8 * (5 + 1)
        assert int(flag(argv, "--workers")) <= tp
        assert "--gather_generation_logits" not in argv  # greedy acceptance
        assert "--gather_context_logits" not in argv
    assert flag(target, "--output_dir") == "engines/llama70b-1b/target"
    assert flag(target, "--checkpoint_dir") == "checkpoints/llama70b-1b/target/trtllm"
    assert plan.target.convert.tp_size == 4 and plan.draft.convert.tp_size == 1


def test_probabilistic_gathers_generation_logits_on_both():
    spec = load_spec(EXAMPLES / "llama8b-1b-h200.yaml")
    data = spec.model_dump()
    data["speculative"]["acceptance"] = "probabilistic"
    plan = make_plan(parse_spec(data))
    assert "--gather_generation_logits" in plan.target.build_argv
    assert "--gather_generation_logits" in plan.draft.build_argv
    assert "--gather_context_logits" not in plan.target.build_argv


def test_max_num_tokens_covers_a_full_verify_batch():
    data = load_spec(EXAMPLES / "llama8b-1b-h200.yaml").model_dump()
    data["engine"].update(max_batch_size=512, max_input_len=1024, max_seq_len=2048)
    data["speculative"]["num_draft_tokens"] = 7
    plan = make_plan(parse_spec(data))
    argv = plan.target.build_argv
    assert int(argv[argv.index("--max_num_tokens") + 1]) == 512 * 8


def test_memory_figures_by_hand_70b_on_4xh100():
    spec = load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml")
    target, draft = load_model_info(spec, "target"), load_model_info(spec, "draft")
    assert target.num_params == 70_553_706_496  # Llama 3.1 70B
    assert draft.num_params == 1_235_814_400  # Llama 3.2 1B
    memory = make_plan(spec).memory
    # K and V x 80 layers x (8 KV heads / 4 ranks) x 128 head size x 2 bytes
    assert memory.target.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2 == 80 * 1024
    # K and V x 16 layers x 8 KV heads x 64 head size x 2 bytes
    assert memory.draft.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2 == 32 * 1024
    # weights per rank: replicated embedding + a quarter of the layers + a quarter of lm_head
    embedding = 128256 * 8192
    per_layer_split = 8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672
    expected = embedding + 80 * (per_layer_split // 4 + 3 * 8192) + (128256 // 4) * 8192
    assert memory.target.weights_bytes == 2 * expected
    assert abs(memory.target.weights_bytes / GIB - 34.32) < 0.01
    # The draft shares GPU 0 only; both engines get the same token budget, bound by GPU 0.
    assert [gpu.draft_fixed > 0 for gpu in memory.gpus] == [True, False, False, False]
    gpu0 = memory.gpus[0]
    assert gpu0.capacity == GPUS["h100"].memory_bytes == 81_559 * MIB
    assert gpu0.target_fixed + gpu0.draft_fixed + gpu0.kv_cache + gpu0.headroom + gpu0.unused == gpu0.capacity
    assert gpu0.unused < gpu0.kv_bytes_per_token * 64  # GPU 0 is full to within one KV block
    assert memory.kv_tokens % 64 == 0
    assert memory.full_sequences >= spec.engine.max_batch_size


def test_70b_on_one_h100_does_not_fit_and_suggests_tp():
    data = load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml").model_dump()
    data["target"]["tp_size"] = 1
    with pytest.raises(PlanError) as raised:
        make_plan(parse_spec(data))
    message = str(raised.value)
    assert "do not fit on 1 x H100" in message
    assert "GiB" in message and "use target.tp_size: 2" in message


def test_unknown_model_without_cache_names_download():
    spec = parse_spec({"name": "x", "target": {"model": "acme/unknown-70b"}, "draft": {"model": "acme/unknown-1b"}})
    with pytest.raises(
        ModelConfigError, match=r"target.model: no config.json for 'acme/unknown-70b'.*trt-spec download"
    ):
        make_plan(spec)


def test_config_read_from_huggingface_cache(tmp_path, monkeypatch):
    """A config.json placed in the HF cache layout is found (offline) before any bundled copy."""
    # huggingface_hub's cache layout: models--<owner>--<name>/{refs/main, snapshots/<commit>/...}
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    commit = "a" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    config = json.loads((EXAMPLES / "pystdlib-pair" / "target" / "config.json").read_text())
    (snapshot / "config.json").write_text(json.dumps(config))
    spec = parse_spec(
        {
            "name": "x",
            "target": {"model": "acme/tiny"},
            "draft": {"model": str(EXAMPLES / "pystdlib-pair" / "draft")},
            "paths": {"hf_cache": str(cache)},
        }
    )
    info = load_model_info(spec, "target")
    assert info.num_params == 6_450_432
    assert "huggingface_hub cache (acme/tiny@main)" in info.source


def test_plan_cli_json_contract():
    result = CliRunner().invoke(main, ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for role in ("target", "draft"):
        assert data[role]["build_argv"][0] == "trtllm-build"
        assert set(data[role]["convert"]) >= {"source", "output_dir", "tp_size"}
    assert data["memory"]["per_gpu"][0]["capacity"] == 81_559 * MIB


def test_plan_cli_human_output_has_table_and_commands():
    result = CliRunner().invoke(main, ["plan", "--spec", str(EXAMPLES / "llama8b-1b-h200.yaml")])
    assert result.exit_code == 0, result.output
    assert "KV cache:" in result.output and "weights/GPU" in result.output
    assert "\ntrtllm-build --checkpoint_dir checkpoints/llama8b-1b/target/trtllm" in result.output
    assert "trt-spec convert --spec" in result.output


# --- the projection `plan` prints (trt_spec/plan/projection.py) -------------------------------------------


def test_plan_cli_prints_the_projection_70b_on_4xh100():
    """The table per K, and t_1, t_d and the K = 5 speedup computed by hand from the two configs."""
    result = CliRunner().invoke(main, ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "projection on H100 SXM (3.35 TB/s HBM)" in out and "not a measurement" in out
    table = out[out.index("tokens/call") :].splitlines()[1:9]
    assert [int(line.split()[0]) for line in table] == list(range(1, 9))

    # Target rank: a quarter of the 80 layers (norms replicated) + a quarter of lm_head; no embedding.
    per_layer_split = 8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672
    target_bytes = 2 * (80 * (per_layer_split // 4 + 3 * 8192) + (128256 // 4) * 8192)
    target_bytes += 80 * 1024 * 4096  # 80 KiB of KV per token per rank x 4,096 cached tokens (max_input_len)
    allreduce = 2 * 80 * (5e-6 + 2 * 3 / 4 * 8192 * 2 / 450e9)
    t_1 = target_bytes / 3.35e12 + allreduce
    # Draft (Llama 3.2 1B, tp 1): 16 layers + its own lm_head (tied in HF, stored by TensorRT-LLM).
    draft_layer = 2048 * 64 * (2 * 32 + 2 * 8) + 3 * 2048 * 8192
    draft_bytes = 2 * (16 * (draft_layer + 3 * 2048) + 128256 * 2048) + 32 * 1024 * 4096
    t_d = draft_bytes / 3.35e12
    assert f"t_1 {t_1 * 1e3:.3f} ms" in out and t_1 * 1e3 == pytest.approx(11.283, abs=1e-3)
    assert f"t_d {t_d * 1e3:.3f} ms" in out and t_d * 1e3 == pytest.approx(0.778, abs=1e-3)
    # K = 5 at alpha 0.7: E = (1 - 0.7^6) / 0.3; t_(K+1) = t_1 but for the all-reduce's bytes of 6 tokens.
    t_6 = target_bytes / 3.35e12 + 2 * 80 * (5e-6 + 2 * 3 / 4 * 6 * 8192 * 2 / 450e9)
    speedup = (1 - 0.7**6) / 0.3 * t_1 / (5 * t_d + t_6)
    row = next(line for line in table if line.split()[0] == "5")
    assert row.split()[1] == "2.94" and row.split()[3] == f"{speedup:.2f}x" == "2.18x"
    assert "<- recommended" in row and "recommended K = 5" in out
    assert "ridge point 295 FLOP/byte" in out and "all-reduce: 2 per layer x 80 layers" in out


def test_plan_cli_projection_options_and_json():
    args = ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml"), "--json", "--alpha", "0.5", "--max-k", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    projection = json.loads(result.output)["projection"]
    assert projection["gpu"] == "h100" and projection["alpha"] == 0.5 and projection["batch"] == 1
    assert [row["k"] for row in projection["rows"]] == [1, 2, 3, 4]
    assert set(projection["rows"][0]) >= {"k", "tokens_per_target_call", "verify_cost_ratio", "speedup"}
    best = max(projection["rows"], key=lambda row: row["speedup"])
    assert projection["recommended_k"] == best["k"]
    assert projection["rows"][1]["tokens_per_target_call"] == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    bad = CliRunner().invoke(main, ["plan", "--spec", str(EXAMPLES / "llama70b-1b-4xh100.yaml"), "--alpha", "2"])
    assert bad.exit_code == 2 and "--alpha" in bad.output


def test_the_engines_take_every_sequence_the_loop_sends_and_the_memory_plan_holds_it():
    """The longest call of a request that reaches max_seq_len: its last verification sends
    max_seq_len - 1 - k tokens plus k drafts; a draft call sends at most max_seq_len - 2. Both are
    within the engines' input limit, so LlmRequest::validate neither refuses nor trims them, and
    the KV cache of each sequence (max_seq_len + K) is what the memory plan sizes."""
    from trt_spec.serving.emulation import engine_facts

    spec = load_spec(EXAMPLES / "llama70b-1b-4xh100.yaml")
    plan = make_plan(spec)
    max_seq_len, k = spec.engine.max_seq_len, spec.num_draft_tokens
    # What the emulator takes the built engines to be (hf_model_dir aside: nothing is downloaded here).
    facts = engine_facts(spec, "target", plan, hf_model_dir="unused")
    assert facts.max_input_len == int(plan.target.build_argv[plan.target.build_argv.index("--max_input_len") + 1])
    for drafts in range(k + 1):
        sequence = max_seq_len - 1 - drafts  # the loop's clamp: sequence + drafts + 1 <= max_seq_len
        assert sequence + drafts <= facts.max_input_len  # not refused, no draft trimmed
        # validate's clamp: prompt + request_output_len + drafts per step (max_draft_len when none).
        per_step = drafts if drafts else k
        assert sequence + (drafts + 1) + per_step <= facts.max_seq_len  # the output is not clamped
    assert plan.memory.tokens_per_sequence == max_seq_len + k
    assert any("max_seq_len - 1" in note for note in plan.notes)
