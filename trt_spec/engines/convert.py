"""Hugging Face checkpoint -> TensorRT-LLM checkpoint, on CPU, with NVIDIA ModelOpt.

The weights are laid out by ``modelopt.torch.export.export_tensorrt_llm_checkpoint``
(nvidia-modelopt 0.37.x, the version TensorRT-LLM 1.2.x pins): fused QKV per rank, column and
row splits for ``tp_size`` ranks, KV heads replicated when there are fewer than ranks, the
vocabulary padded to a multiple of ``tp_size``, ``rank<N>.safetensors`` per rank. It runs on CPU.

Without ``tensorrt_llm`` installed, ModelOpt writes ``config.json`` by hand and takes the rotary
settings from the transformers config object, where transformers 5 no longer keeps them
(``rope_theta`` and ``rope_scaling`` moved into ``rope_parameters``). So we set those fields
from the ``config.json`` file itself, whatever the transformers version (see
:func:`config_overrides`), and check the numbers ModelOpt wrote against the Hugging Face
config before publishing.

The result goes to ``<checkpoints>/<name>/<role>/trtllm/``: written into a temporary sibling,
checked, then renamed into place, with ``manifest.json`` recording the inputs (source files,
tp size, dtype, converter and library versions). The same inputs again skip the conversion.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from trt_spec import atomic
from trt_spec.checkpoints.config import SUPPORTED_ARCHITECTURES
from trt_spec.checkpoints.download import SAFETENSORS_INDEX, Snapshot, local_snapshot
from trt_spec.engines.manifest import MANIFEST, read_manifest
from trt_spec.engines.versions import package_version
from trt_spec.errors import ConversionFailed
from trt_spec.layout import logs_dir, trtllm_checkpoint_dir
from trt_spec.spec import Spec

CONVERTER_VERSION = 1  # bump when the output for the same inputs changes
# ModelOpt's decoder family for both.
MODELOPT_DECODER = "llama"
# Loggers whose records belong in the conversion log, not on the terminal.
_LIBRARY_LOGGERS = ("transformers", "modelopt", "torch", "huggingface_hub")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ConvertResult:
    role: str
    output_dir: Path
    skipped: bool  # the checkpoint in place already matched the inputs
    duration_s: float
    tp_size: int
    dtype: str
    source: str  # the spec's model
    source_commit: str | None  # None for a local directory
    log_path: Path | None  # None when skipped


def convert_checkpoint(
    spec: Spec, role: str, *, force: bool = False, progress: Progress | None = None
) -> ConvertResult:
    """Bring ``role``'s TensorRT-LLM checkpoint up to date with its Hugging Face checkpoint.

    ``progress`` receives one line per step. ``force`` converts even when the inputs match.

    Raises:
        NotDownloadedError: a Hub model that ``trt-spec download`` has not fetched.
        IncompleteSnapshotError: the Hugging Face files are missing or truncated.
        ConversionFailed: the model is not supported, or loading or exporting it failed; names the log.
    """
    say = progress or (lambda message: None)
    started = time.monotonic()
    ref = spec.role(role)
    dtype = spec.engine.dtype
    snapshot = local_snapshot(spec, role)
    output_dir = trtllm_checkpoint_dir(spec, role)
    inputs = conversion_inputs(snapshot, ref.tp_size, dtype)

    def result(skipped: bool, log_path: Path | None) -> ConvertResult:
        duration = 0.0 if skipped else round(time.monotonic() - started, 3)
        return ConvertResult(
            role, output_dir, skipped, duration, ref.tp_size, dtype, ref.model, snapshot.commit, log_path
        )

    if not force and _up_to_date(output_dir, inputs):
        say(f"{role}: TensorRT-LLM checkpoint is up to date ({output_dir})")
        return result(True, None)

    hf_config = json.loads((snapshot.path / "config.json").read_text())
    architecture = (hf_config.get("architectures") or ["(none)"])[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConversionFailed(
            f"{role}: {ref.model} is {architecture}; the converter supports {', '.join(SUPPORTED_ARCHITECTURES)} "
            "(`trt-spec check` lists what else is wrong)",
            role=role,
            log_path=None,
        )

    log_path = logs_dir(spec) / f"convert-{role}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    source = f"{ref.model}@{snapshot.commit[:12]}" if snapshot.commit else str(snapshot.path)
    say(f"{role}: converting {source} to a TensorRT-LLM checkpoint (tp {ref.tp_size}, {dtype}); log: {log_path}")
    try:
        with atomic.staged_dir(output_dir) as partial:
            problems = _convert_into(
                partial,
                snapshot,
                hf_config,
                tp_size=ref.tp_size,
                dtype=dtype,
                trust_remote_code=ref.trust_remote_code,
                log_path=log_path,
                say=lambda line: say(f"{role}: {line}"),
            )
            if problems:
                raise ConversionFailed(
                    f"{role}: the TensorRT-LLM checkpoint exported from {ref.model} has {'; '.join(problems)}; "
                    f"see the log: {log_path}",
                    role=role,
                    log_path=log_path,
                )
            atomic.write_json(partial / MANIFEST, {**inputs, "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    except ConversionFailed:
        raise
    except Exception as exc:
        with open(log_path, "a") as log:
            traceback.print_exception(exc, file=log)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConversionFailed(
            f"{role}: converting {ref.model} failed ({type(exc).__name__}: {reason}); see the log: {log_path}",
            role=role,
            log_path=log_path,
        ) from exc
    done = result(False, log_path)
    say(f"{role}: wrote {output_dir} in {done.duration_s:.1f} s")
    return done


def conversion_inputs(snapshot: Snapshot, tp_size: int, dtype: str) -> dict:
    """Everything the converted checkpoint depends on; equal inputs give an equal checkpoint."""
    files = {}
    for name in sorted(snapshot.files):
        if name == "config.json" or name == SAFETENSORS_INDEX or name.endswith(".safetensors"):
            stat = (snapshot.path / name).stat()
            files[name] = [stat.st_size, stat.st_mtime_ns]
    return {
        "converter": CONVERTER_VERSION,
        "nvidia-modelopt": package_version("nvidia-modelopt"),
        "transformers": package_version("transformers"),
        "source": {"model": snapshot.model, "revision": snapshot.revision, "commit": snapshot.commit},
        "files": files,
        "tp_size": tp_size,
        "dtype": dtype,
    }


def config_overrides(hf_config: dict) -> dict:
    """TensorRT-LLM ``LLaMAConfig`` fields taken from the Hugging Face ``config.json`` file.

    Rotary settings: ModelOpt reads them from the transformers config object, which keeps them
    in ``rope_parameters`` since transformers 5, so they would be lost. Biases: stated
    explicitly (the converter refuses biased models upstream). ``tie_word_embeddings``: ModelOpt
    always writes ``lm_head.weight``, so the engine must read it rather than share the
    embedding. ``logits_dtype``: float32, so acceptance compares unrounded probabilities.
    """
    rope_parameters = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling")
    if scaling is None and rope_parameters:
        scaling = {key: value for key, value in rope_parameters.items() if key != "rope_theta"}
    rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    return {
        "rotary_base": float(hf_config.get("rope_theta") or rope_parameters.get("rope_theta") or 10000.0),
        "rotary_scaling": None if rope_type == "default" else scaling,
        "attn_bias": bool(hf_config.get("attention_bias", False)),
        "mlp_bias": bool(hf_config.get("mlp_bias", False)),
        "tie_word_embeddings": False,
        "logits_dtype": "float32",
    }


def _up_to_date(output_dir: Path, inputs: dict) -> bool:
    manifest = read_manifest(output_dir)
    if manifest is None or {key: manifest.get(key) for key in inputs} != inputs:
        return False
    ranks = [output_dir / f"rank{rank}.safetensors" for rank in range(inputs["tp_size"])]
    return (output_dir / "config.json").is_file() and all(path.is_file() for path in ranks)


def _convert_into(
    export_dir: Path,
    snapshot: Snapshot,
    hf_config: dict,
    *,
    tp_size: int,
    dtype: str,
    trust_remote_code: bool,
    log_path: Path,
    say: Progress,
) -> list[str]:
    """Load the HF model on CPU, export it with ModelOpt, complete its config; returns what disagrees."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    with open(log_path, "w") as log:
        say(f"loading {snapshot.path} on CPU")
        with _output_to(log):
            model = AutoModelForCausalLM.from_pretrained(
                snapshot.path, dtype=torch_dtype, trust_remote_code=trust_remote_code
            )
        say(f"exporting {tp_size} rank(s) with nvidia-modelopt {package_version('nvidia-modelopt')}")
        with _output_to(log), torch.inference_mode():
            from modelopt.torch.export import export_tensorrt_llm_checkpoint

            export_tensorrt_llm_checkpoint(
                model,
                decoder_type=MODELOPT_DECODER,
                dtype=torch_dtype,
                export_dir=export_dir,
                inference_tensor_parallel=tp_size,
            )
    config_path = export_dir / "config.json"
    config = {**json.loads(config_path.read_text()), **config_overrides(hf_config)}
    atomic.write_json(config_path, config)
    return _verify(export_dir, config, hf_config, tp_size=tp_size, dtype=dtype)


def _verify(checkpoint_dir: Path, config: dict, hf_config: dict, *, tp_size: int, dtype: str) -> list[str]:
    """What ModelOpt wrote that disagrees with the Hugging Face config (empty: all agrees)."""
    num_heads = hf_config["num_attention_heads"]
    expected = {
        "architecture": hf_config["architectures"][0],
        "dtype": dtype,
        "vocab_size": hf_config["vocab_size"],
        "hidden_size": hf_config["hidden_size"],
        "intermediate_size": hf_config["intermediate_size"],
        "num_hidden_layers": hf_config["num_hidden_layers"],
        "num_attention_heads": num_heads,
        "num_key_value_heads": hf_config.get("num_key_value_heads") or num_heads,
        "head_size": hf_config.get("head_dim") or hf_config["hidden_size"] // num_heads,
        "position_embedding_type": "rope_gpt_neox",
        "mapping": {"world_size": tp_size, "tp_size": tp_size, "pp_size": 1},
    }
    problems = [
        f"{key} {config.get(key)!r} (expected {value!r})" for key, value in expected.items() if config.get(key) != value
    ]
    ranks = sorted(path.name for path in checkpoint_dir.glob("rank*.safetensors"))
    wanted = sorted(f"rank{rank}.safetensors" for rank in range(tp_size))
    if ranks != wanted:
        problems.append(f"weight files {ranks} (expected {wanted})")
    return problems


@contextlib.contextmanager
def _output_to(log: TextIO) -> Iterator[None]:
    """Send what the libraries print, warn and log during a conversion to ``log``."""
    handler = logging.StreamHandler(log)
    saved = {}
    for name in _LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers[:], logger.propagate)
        logger.handlers[:] = [handler]
        logger.propagate = False
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("default")

            def show_warning(
                message: Warning | str,
                category: type[Warning],
                filename: str,
                lineno: int,
                file: TextIO | None = None,
                line: str | None = None,
            ) -> None:
                log.write(warnings.formatwarning(message, category, filename, lineno, line))

            warnings.showwarning = show_warning
            yield
    finally:
        for name, (handlers, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.propagate = propagate
