"""A model's architecture numbers, read from its Hugging Face ``config.json``.

Looked up, in order: the local directory the spec names; the huggingface_hub cache (at the
revision pinned in the download lock file, else the spec's); a bundled copy of the public
``config.json`` for a few well-known gated models, so plans work offline before any download.
Nothing here touches the network or a GPU.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from trt_spec.errors import ModelConfigError
from trt_spec.layout import lock_path
from trt_spec.spec import Spec

# The architectures `convert` and `build` take: TensorRT-LLM 1.2.x builds both with its
# LLaMAForCausalLM (its MODEL_MAP).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelInfo:
    """The numbers of a decoder-only transformer that sizing and engine building need."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    source: str  # where the config.json was read from

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (Llama: attention, gated MLP, two RMS norms)."""
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return attention + mlp + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        final_norm = self.hidden_size
        return self.embedding_params + self.num_layers * self.layer_params + final_norm + self.lm_head_params


def model_info_from_config(config: dict, source: str) -> ModelInfo:
    """Read the fields we need; raises ``KeyError`` naming the first missing one."""
    num_heads = config["num_attention_heads"]
    architectures = config.get("architectures") or ["?"]
    return ModelInfo(
        architecture=architectures[0],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
        vocab_size=config["vocab_size"],
        max_position_embeddings=config.get("max_position_embeddings", 0),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        source=source,
    )


def hf_cache_dir(spec: Spec) -> Path:
    """The huggingface_hub cache: ``paths.hf_cache``, else ``HF_HUB_CACHE``, else ``HF_HOME/hub``.

    Read at call time (huggingface_hub reads its variables once, at import).
    """
    if spec.paths.hf_cache:
        return Path(spec.paths.hf_cache).expanduser().resolve()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(hf_home).expanduser() / "hub"


def read_lock(spec: Spec) -> dict:
    """The download lock file's content; empty when ``trt-spec download`` has not run."""
    try:
        lock = json.loads(lock_path(spec).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return lock if isinstance(lock, dict) else {}


def locked_entry(spec: Spec, role: str) -> dict | None:
    """The lock entry of ``role``, if it is for the spec's current model and revision."""
    ref = spec.role(role)
    entry = read_lock(spec).get(role)
    if not isinstance(entry, dict):
        return None
    if entry.get("model") != ref.model or entry.get("revision") != (ref.revision or "main"):
        return None
    return entry


def locked_revision(spec: Spec, role: str) -> str | None:
    """The commit ``trt-spec download`` resolved for this model, if it has run."""
    entry = locked_entry(spec, role) or {}
    return entry.get("commit")


def find_config_json(spec: Spec, role: str) -> tuple[Path, str]:
    """The path of the model's ``config.json`` and a word on where it came from.

    Raises:
        ModelConfigError: when no copy is found, naming the model and ``trt-spec download``.
    """
    ref = spec.role(role)
    local = ref.local_dir(spec.source_dir)
    if local is not None:
        path = local / "config.json"
        if not path.is_file():
            raise ModelConfigError(
                f"{role}.model: {local} has no config.json; is it a Hugging Face checkpoint?",
                model=ref.model,
            )
        return path, str(local)

    from huggingface_hub import try_to_load_from_cache

    revision = locked_revision(spec, role) or ref.revision or "main"
    cached = try_to_load_from_cache(ref.model, "config.json", cache_dir=hf_cache_dir(spec), revision=revision)
    if isinstance(cached, str):
        return Path(cached), f"huggingface_hub cache ({ref.model}@{revision})"

    bundled = resources.files("trt_spec") / "data" / "hf_configs" / ref.model / "config.json"
    if ref.revision in (None, "main") and bundled.is_file():
        return Path(str(bundled)), f"bundled copy of {ref.model}'s public config.json"

    raise ModelConfigError(
        f"{role}.model: no config.json for {ref.model!r} (revision {revision}) in the local cache; "
        f"run `trt-spec download --spec FILE` first",
        model=ref.model,
    )


def load_model_info(spec: Spec, role: str) -> ModelInfo:
    path, source = find_config_json(spec, role)
    try:
        config = json.loads(path.read_text())
        return model_info_from_config(config, source)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}", model=spec.role(role).model) from None
    except KeyError as exc:
        raise ModelConfigError(
            f"{path} lacks {exc.args[0]!r}; only decoder-only transformers (e.g. Llama) are supported",
            model=spec.role(role).model,
        ) from None
