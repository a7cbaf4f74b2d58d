"""``trt-spec convert``: HF -> TensorRT-LLM checkpoints on CPU, and the weights round-trip.

The round trip re-assembles the ranks the way TensorRT-LLM 1.2.x splits them and must give back
the Hugging Face tensors exactly. The names follow TensorRT-LLM's Llama model: ``attention.qkv``
is [q; k; v] of the rank's heads (KV heads replicated when fewer than ranks),
``attention.dense`` is o_proj split by input columns, ``mlp.fc`` is gate_proj (the activated
half of GatedMLP), ``mlp.gate`` is up_proj, ``mlp.proj`` is down_proj split by columns, and the
vocabulary rows are split by rank and padded with zeros to a multiple of ``tp_size``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from trt_spec.cli import main
from trt_spec.engines.convert import convert_checkpoint
from trt_spec.engines.manifest import MANIFEST
from trt_spec.errors import ConversionFailed, NotDownloadedError
from trt_spec.layout import trtllm_checkpoint_dir
from trt_spec.spec import parse_spec

DEMO = Path(__file__).resolve().parents[1] / "examples" / "pystdlib-pair"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make_spec(tmp_path: Path, target: str | Path, draft: str | Path, *, target_tp=1, draft_tp=1, dtype="float16"):
    return parse_spec(
        {
            "name": "pair",
            "target": {"model": str(target), "tp_size": target_tp},
            "draft": {"model": str(draft), "tp_size": draft_tp},
            "engine": {"dtype": dtype, "max_input_len": 512, "max_seq_len": 1008},
            "paths": {"checkpoints": str(tmp_path / "checkpoints")},
        }
    )


def tiny_llama(directory: Path, *, dtype=torch.float16, mistral=False, **overrides) -> Path:
    """A random Llama (or Mistral) saved as transformers does, with the demo tokenizer beside it."""
    settings = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        architectures=["MistralForCausalLM" if mistral else "LlamaForCausalLM"],
    )
    settings.update(overrides)
    torch.manual_seed(0)
    config_class, model_class = (MistralConfig, MistralForCausalLM) if mistral else (LlamaConfig, LlamaForCausalLM)
    model_class(config_class(**settings)).to(dtype).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(DEMO / "draft" / name, directory / name)
    return directory


def hf_weights(model_dir: Path, dtype: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


def reassemble(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict, rebuilt from a TensorRT-LLM checkpoint's ranks."""
    config = json.loads((checkpoint_dir / "config.json").read_text())
    tp = config["mapping"]["tp_size"]
    ranks = [load_file(checkpoint_dir / f"rank{rank}.safetensors") for rank in range(tp)]
    head, heads, kv_heads = config["head_size"], config["num_attention_heads"], config["num_key_value_heads"]
    q_rows, kv_rows = heads // tp * head, max(kv_heads // tp, 1) * head

    def replicated(name: str) -> torch.Tensor:
        for weights in ranks[1:]:
            assert torch.equal(weights[name], ranks[0][name]), f"{name} differs between ranks"
        return ranks[0][name]

    def vocab_rows(name: str) -> torch.Tensor:
        stacked = torch.cat([weights[name] for weights in ranks], dim=0)  # [vocab padded to tp, hidden]
        assert stacked.shape[0] == -(-config["vocab_size"] // tp) * tp
        assert not stacked[config["vocab_size"] :].any(), "vocabulary padding must be zeros"
        return stacked[: config["vocab_size"]]

    hf = {
        "model.embed_tokens.weight": vocab_rows("transformer.vocab_embedding.weight"),
        "lm_head.weight": vocab_rows("lm_head.weight"),
        "model.norm.weight": replicated("transformer.ln_f.weight"),
    }
    for layer in range(config["num_hidden_layers"]):
        trt, ours = f"transformer.layers.{layer}.", f"model.layers.{layer}."
        q, k, v = zip(*(weights[trt + "attention.qkv.weight"].split([q_rows, kv_rows, kv_rows]) for weights in ranks))
        if kv_heads < tp:  # each KV head serves tp // kv_heads consecutive ranks
            group = tp // kv_heads
            for rank in range(tp):
                assert torch.equal(k[rank], k[rank // group * group]) and torch.equal(v[rank], v[rank // group * group])
            k, v = k[::group], v[::group]
        hf[ours + "self_attn.q_proj.weight"] = torch.cat(q)
        hf[ours + "self_attn.k_proj.weight"] = torch.cat(k)
        hf[ours + "self_attn.v_proj.weight"] = torch.cat(v)
        hf[ours + "self_attn.o_proj.weight"] = torch.cat([w[trt + "attention.dense.weight"] for w in ranks], dim=1)
        hf[ours + "mlp.gate_proj.weight"] = torch.cat([w[trt + "mlp.fc.weight"] for w in ranks])
        hf[ours + "mlp.up_proj.weight"] = torch.cat([w[trt + "mlp.gate.weight"] for w in ranks])
        hf[ours + "mlp.down_proj.weight"] = torch.cat([w[trt + "mlp.proj.weight"] for w in ranks], dim=1)
        hf[ours + "input_layernorm.weight"] = replicated(trt + "input_layernorm.weight")
        hf[ours + "post_attention_layernorm.weight"] = replicated(trt + "post_layernorm.weight")
    return hf


def assert_round_trip(checkpoint_dir: Path, model_dir: Path, dtype: str) -> None:
    expected = hf_weights(model_dir, dtype)
    rebuilt = reassemble(checkpoint_dir)
    assert sorted(rebuilt) == sorted(expected)
    for name, tensor in expected.items():
        assert rebuilt[name].dtype == tensor.dtype, name
        assert torch.equal(rebuilt[name], tensor), name


@pytest.mark.parametrize(("target_tp", "draft_tp"), [(1, 1), (2, 2)])
def test_demo_pair_converts_and_round_trips(tmp_path, target_tp, draft_tp):
    spec = make_spec(tmp_path, DEMO / "target", DEMO / "draft", target_tp=target_tp, draft_tp=draft_tp)
    for role, layers, heads, kv_heads, hidden in (("target", 6, 8, 4, 256), ("draft", 2, 4, 2, 128)):
        result = convert_checkpoint(spec, role)
        tp = spec.role(role).tp_size
        assert not result.skipped and result.output_dir == trtllm_checkpoint_dir(spec, role)
        assert sorted(p.name for p in result.output_dir.iterdir()) == sorted(
            ["config.json", MANIFEST, "quant_cfg.json"] + [f"rank{r}.safetensors" for r in range(tp)]
        )
        config = json.loads((result.output_dir / "config.json").read_text())
        assert {
            key: config[key]
            for key in (
                "architecture",
                "dtype",
                "vocab_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "hidden_size",
                "head_size",
                "position_embedding_type",
                "mapping",
                "rotary_base",
                "rotary_scaling",
            )
        } == {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": 4096,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "hidden_size": hidden,
            "head_size": 32,
            "position_embedding_type": "rope_gpt_neox",
            "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
            "rotary_base": 10000.0,
            "rotary_scaling": None,
        }
        assert config["quantization"]["quant_algo"] is None
        assert_round_trip(result.output_dir, DEMO / role, "float16")


@pytest.mark.parametrize(
    ("case", "overrides", "tp"),
    [
        ("gqa, tp 2", {}, 2),
        ("kv heads replicated to 4 ranks", {}, 4),
        ("multi-query, tp 2", {"num_key_value_heads": 1}, 2),
        ("vocab padded to the ranks", {"vocab_size": 509}, 2),
        ("tied embeddings", {"tie_word_embeddings": True}, 2),
        ("explicit head_dim", {"head_dim": 32}, 2),
        ("mistral", {"mistral": True, "sliding_window": None}, 2),
    ],
)
def test_tiny_llamas_round_trip(tmp_path, case, overrides, tp):
    model_dir = tiny_llama(tmp_path / "model", **overrides)
    spec = make_spec(tmp_path, model_dir, DEMO / "draft", target_tp=tp)
    result = convert_checkpoint(spec, "target")
    config = json.loads((result.output_dir / "config.json").read_text())
    assert config["architecture"] == ("MistralForCausalLM" if overrides.get("mistral") else "LlamaForCausalLM")
    assert config["mapping"]["tp_size"] == tp
    assert config["num_key_value_heads"] == overrides.get("num_key_value_heads", 2)
    assert config["tie_word_embeddings"] is False  # lm_head.weight is stored on every rank
    assert_round_trip(result.output_dir, model_dir, "float16")


def test_float32_weights_become_a_bfloat16_checkpoint(tmp_path):
    model_dir = tiny_llama(tmp_path / "model", dtype=torch.float32)
    spec = make_spec(tmp_path, model_dir, DEMO / "draft", target_tp=2, dtype="bfloat16")
    result = convert_checkpoint(spec, "target")
    assert json.loads((result.output_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(result.output_dir / "rank1.safetensors").values()} == {torch.bfloat16}
    assert_round_trip(result.output_dir, model_dir, "bfloat16")


LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_type": "llama3",
}


@pytest.mark.parametrize(
    ("writer", "rope_fields"),
    [
        ("transformers 5", {"rope_parameters": {"rope_theta": 500000.0, **LLAMA3_SCALING}}),
        ("transformers 4", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING}),
    ],
)
def test_rope_settings_reach_the_config(tmp_path, writer, rope_fields):
    """Llama 3 rotary settings, from a config.json in either transformers' layout."""
    model_dir = tiny_llama(tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):
        config.pop(key, None)
    (model_dir / "config.json").write_text(json.dumps({**config, **rope_fields}))
    result = convert_checkpoint(make_spec(tmp_path, model_dir, DEMO / "draft"), "target")
    written = json.loads((result.output_dir / "config.json").read_text())
    assert (written["rotary_base"], written["rotary_scaling"]) == (500000.0, LLAMA3_SCALING)


def test_unchanged_inputs_skip_and_changed_ones_convert_again(tmp_path):
    model_dir = tiny_llama(tmp_path / "model")
    spec = make_spec(tmp_path, model_dir, DEMO / "draft")
    first = convert_checkpoint(spec, "target")
    rank0 = first.output_dir / "rank0.safetensors"
    stamp = rank0.stat().st_mtime_ns

    lines = []
    again = convert_checkpoint(spec, "target", progress=lines.append)
    assert again.skipped and again.duration_s == 0.0 and rank0.stat().st_mtime_ns == stamp
    assert lines == [f"target: TensorRT-LLM checkpoint is up to date ({first.output_dir})"]

    assert not convert_checkpoint(spec, "target", force=True).skipped
    assert not convert_checkpoint(make_spec(tmp_path, model_dir, DEMO / "draft", target_tp=2), "target").skipped
    assert not convert_checkpoint(
        make_spec(tmp_path, model_dir, DEMO / "draft", target_tp=2, dtype="bfloat16"), "target"
    ).skipped
    spec = make_spec(tmp_path, model_dir, DEMO / "draft", target_tp=2, dtype="bfloat16")
    assert convert_checkpoint(spec, "target").skipped
    os.utime(model_dir / "model.safetensors")  # a re-saved source
    assert not convert_checkpoint(spec, "target").skipped


def test_a_failed_conversion_keeps_the_previous_checkpoint_and_leaves_no_partial(tmp_path):
    model_dir = tiny_llama(tmp_path / "model")
    spec = make_spec(tmp_path, model_dir, DEMO / "draft")
    good = convert_checkpoint(spec, "target")
    before = {p.name: p.read_bytes() for p in good.output_dir.iterdir()}
    (good.output_dir.parent / ".trtllm.partial-999999").mkdir()  # from a conversion that was killed

    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))  # weights no longer fit
    with pytest.raises(ConversionFailed) as caught:
        convert_checkpoint(spec, "target")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"target: converting {model_dir} failed (")
    assert message.endswith(f"see the log: {caught.value.log_path}")
    assert "Traceback" in caught.value.log_path.read_text()  # the details are in the log
    assert {p.name: p.read_bytes() for p in good.output_dir.iterdir()} == before
    assert sorted(p.name for p in good.output_dir.parent.iterdir()) == ["trtllm"]


def test_an_unsupported_architecture_is_refused_before_loading(tmp_path):
    model_dir = tiny_llama(tmp_path / "model")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(
        ConversionFailed, match=r"target: .* is Qwen2ForCausalLM; the converter supports LlamaForCausalLM"
    ):
        convert_checkpoint(make_spec(tmp_path, model_dir, DEMO / "draft"), "target")
    assert not trtllm_checkpoint_dir(make_spec(tmp_path, model_dir, DEMO / "draft"), "target").exists()


def test_a_hub_model_must_be_downloaded_first(tmp_path):
    spec = make_spec(tmp_path, "acme/never-downloaded", DEMO / "draft")
    with pytest.raises(NotDownloadedError, match=r"acme/never-downloaded@main has not been downloaded"):
        convert_checkpoint(spec, "target")


def test_a_downloaded_hub_snapshot_converts_with_its_commit(tmp_path):
    """download pins the commit; convert reads exactly that snapshot and reports it."""
    from test_download import populate_cache

    from trt_spec.checkpoints.download import download

    commit = "c" * 40
    populate_cache(tmp_path / "hub", "acme/tiny", DEMO / "draft", commit)
    spec = parse_spec(
        {
            "name": "hub",
            "target": {"model": str(DEMO / "target")},
            "draft": {"model": "acme/tiny"},
            "paths": {"checkpoints": str(tmp_path / "checkpoints"), "hf_cache": str(tmp_path / "hub")},
        }
    )
    download(spec, progress=False)
    result = convert_checkpoint(spec, "draft")
    assert result.source_commit == commit
    manifest = json.loads((result.output_dir / MANIFEST).read_text())
    assert manifest["source"] == {"model": "acme/tiny", "revision": "main", "commit": commit}
    assert_round_trip(result.output_dir, DEMO / "draft", "float16")


def test_cli_convert_reports_each_role(tmp_path):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        f"name: demo\ntarget: {{model: {DEMO / 'target'}, tp_size: 2}}\ndraft: {{model: {DEMO / 'draft'}}}\n"
        f"engine: {{max_input_len: 512, max_seq_len: 1008}}\npaths: {{checkpoints: {tmp_path / 'checkpoints'}}}\n"
    )
    runner = CliRunner()
    result = runner.invoke(main, ["convert", "--spec", str(spec_file)])
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert out[0].startswith("target  converted in ") and out[0].endswith(
        f"(tp 2, float16)  {tmp_path / 'checkpoints' / 'demo' / 'target' / 'trtllm'}"
    )
    assert out[1].startswith("draft   converted in ")
    assert "target: exporting 2 rank(s) with nvidia-modelopt 0.37" in result.stderr

    result = runner.invoke(main, ["convert", "--spec", str(spec_file), "--role", "draft"])
    assert result.stdout.splitlines() == [
        f"draft   up to date (tp 1, float16)  {tmp_path / 'checkpoints' / 'demo' / 'draft' / 'trtllm'}"
    ]
