"""The deployment spec: one YAML file, parsed into one frozen, validated object.

Relative paths: a local ``model`` directory is resolved against the spec file's folder (so a
spec can sit next to its checkpoints); the output ``paths`` are resolved against the current
working directory (the project root, where ``make`` runs).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from trt_spec.errors import SpecError
from trt_spec.gpus import GpuName
from trt_spec.runtime import methods
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS

TP_SIZES = (1, 2, 4, 8)
# A Hugging Face repo id: "name" or "owner/name".
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class _Section(BaseModel):
    # strict: YAML already types scalars, so "8" for an int is a mistake, not something to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSpec(_Section):
    model: str = Field(min_length=1, description="Hugging Face repo id, or a local directory")
    revision: str | None = Field(None, description="branch, tag or commit; default: main")
    tp_size: int = Field(1, description="tensor parallel size: 1, 2, 4 or 8")
    trust_remote_code: bool = Field(False, description="allow models that ship their own code")

    @field_validator("tp_size")
    @classmethod
    def _check_tp(cls, tp_size: int) -> int:
        if tp_size not in TP_SIZES:
            raise ValueError(f"tp_size must be one of {', '.join(map(str, TP_SIZES))}; got {tp_size}")
        return tp_size

    def local_dir(self, base_dir: Path) -> Path | None:
        """The local checkpoint directory this refers to, or None for a Hub repo id."""
        candidate = Path(self.model).expanduser()
        if not candidate.is_absolute():
            candidate = base_dir / candidate
        if candidate.is_dir():
            return candidate.resolve()
        return None


class PromptLookupSpec(_Section):
    """``speculative.prompt_lookup``: the suffix n-grams matched against the request's tokens."""

    max_ngram: int = Field(
        methods.DEFAULT_MAX_NGRAM,
        ge=1,
        le=methods.MAX_NGRAM_LIMIT,
        description="longest suffix n-gram matched (TensorRT-LLM: max_matching_ngram_size)",
    )
    min_ngram: int = Field(methods.DEFAULT_MIN_NGRAM, ge=1, description="shortest suffix n-gram matched")

    @field_validator("min_ngram")
    @classmethod
    def _check_order(cls, min_ngram: int, info: ValidationInfo) -> int:
        max_ngram = info.data.get("max_ngram")
        if max_ngram is not None and min_ngram > max_ngram:
            raise ValueError(
                f"speculative.prompt_lookup.min_ngram ({min_ngram}) is larger than max_ngram ({max_ngram}); "
                f"set min_ngram <= max_ngram"
            )
        return min_ngram

    @property
    def params(self) -> methods.LookupParams:
        return methods.LookupParams(min_ngram=self.min_ngram, max_ngram=self.max_ngram)


class SpeculativeSpec(_Section):
    method: str = Field(methods.DEFAULT_METHOD, description=f"where drafts come from: {' | '.join(methods.names())}")
    num_draft_tokens: int = Field(
        5, ge=1, le=MAX_DRAFT_TOKENS, description="K: tokens drafted per step; the target's max_draft_len"
    )
    acceptance: Literal["greedy", "probabilistic"] = Field(
        "greedy", description="greedy, or rejection sampling with the draft's logits"
    )
    prompt_lookup: PromptLookupSpec = PromptLookupSpec()

    @field_validator("method")
    @classmethod
    def _check_method(cls, method: str) -> str:
        if method not in methods.METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(methods.names())}")
        return method

    @property
    def speculation(self) -> methods.Method:
        """The registered method (``trt_spec.runtime.methods``)."""
        return methods.get(self.method)


class EngineSpec(_Section):
    dtype: Literal["float16", "bfloat16"] = "float16"
    gpu: GpuName = "h100"
    max_batch_size: int = Field(8, ge=1, le=4096)
    max_input_len: int = Field(4096, ge=1)
    max_seq_len: int = Field(8192, ge=2)

    @field_validator("max_seq_len")
    @classmethod
    def _check_lengths(cls, max_seq_len: int, info: ValidationInfo) -> int:
        max_input_len = info.data.get("max_input_len")
        if max_input_len is not None and max_seq_len <= max_input_len:
            raise ValueError(
                f"max_seq_len ({max_seq_len}) must be greater than max_input_len "
                f"({max_input_len}), or no token could be generated"
            )
        return max_seq_len


class TritonSpec(_Section):
    flavor: Literal["llmapi", "tensorrtllm", "torch"] = "tensorrtllm"


class PathsSpec(_Section):
    checkpoints: str = "checkpoints"
    engines: str = "engines"
    model_repo: str = "model_repo"
    hf_cache: str | None = None


class Spec(_Section):
    """A validated deployment spec. Build one with :func:`load_spec` or :func:`parse_spec`."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)
    target: ModelSpec
    draft: ModelSpec | None = None  # required by the methods with a draft model, refused by the others
    speculative: SpeculativeSpec = SpeculativeSpec()
    engine: EngineSpec = EngineSpec()
    triton: TritonSpec = TritonSpec()
    paths: PathsSpec = PathsSpec()

    # The spec file's folder: local model directories are relative to it.
    _source_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("draft")
    @classmethod
    def _check_pair(cls, draft: ModelSpec | None, info: ValidationInfo) -> ModelSpec | None:
        target = info.data.get("target")
        if draft is not None and target is not None and draft.tp_size > target.tp_size:
            raise ValueError(
                f"draft.tp_size ({draft.tp_size}) is larger than target.tp_size "
                f"({target.tp_size}); the draft runs on the target's GPUs"
            )
        return draft

    @property
    def source_dir(self) -> Path:
        return self._source_dir

    @property
    def num_draft_tokens(self) -> int:
        return self.speculative.num_draft_tokens

    @property
    def method(self) -> methods.Method:
        """The speculation method (``speculative.method``)."""
        return self.speculative.speculation

    @property
    def roles(self) -> tuple[str, ...]:
        """The models this spec deploys: ``("target", "draft")``, or ``("target",)`` for a method
        without a draft model."""
        return self.method.roles

    @property
    def has_draft(self) -> bool:
        return self.draft is not None

    def role(self, role: str) -> ModelSpec:
        """``target``, or ``draft`` where the method has one.

        Raises:
            KeyError: ``draft`` of a spec without a draft model.
        """
        model = {"target": self.target, "draft": self.draft}[role]
        if model is None:
            raise KeyError(f"speculative.method {self.speculative.method} has no {role} model")
        return model

    def content_hash(self) -> str:
        """sha256 of the spec's values (not its formatting or comments)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def parse_spec(data: Any, *, source_dir: Path | None = None, path: Path | None = None) -> Spec:
    """Validate a mapping (from YAML) into a :class:`Spec`.

    Raises:
        SpecError: naming the key path and the offending value of the first problem.
    """
    if not isinstance(data, dict):
        raise SpecError(
            f"a spec is a YAML mapping (name:, target:, draft:, ...); got {type(data).__name__}",
            path=path,
        )
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise _spec_error(exc, data, path) from None
    spec._source_dir = (source_dir or Path.cwd()).resolve()
    _check_method_models(spec, path)
    _check_model_refs(spec, path)
    return spec


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file.

    Raises:
        SpecError: the file is missing, is not YAML, or has a bad key or value.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError("spec file not found; `trt-spec init -o FILE` writes one", path=path) from None
    except OSError as exc:
        raise SpecError(f"cannot read the spec file: {exc.strerror}", path=path) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", path=path) from None
    return parse_spec(data, source_dir=path.parent, path=path)


def _check_method_models(spec: Spec, path: Path | None) -> None:
    method = spec.method
    if method.uses_draft_model and spec.draft is None:
        raise SpecError(
            f"draft: required for speculative.method {method.name} ({method.summary}); add a draft section "
            f"(draft: {{model: ...}}) or set speculative.method: prompt_lookup, which needs no draft model",
            key_path="draft",
            path=path,
        )
    if not method.uses_draft_model and spec.draft is not None:
        raise SpecError(
            f"draft: speculative.method {method.name} uses no draft model, but the spec names "
            f"{spec.draft.model!r}; remove the draft section, or set speculative.method: hybrid to use "
            f"the draft model where the lookup finds no match",
            key_path="draft",
            path=path,
        )


def _check_model_refs(spec: Spec, path: Path | None) -> None:
    for role in spec.roles:
        ref = spec.role(role)
        if ref.local_dir(spec.source_dir) is not None:
            continue
        looks_like_path = ref.model.startswith(("/", "./", "../", "~")) or ref.model.count("/") > 1
        if looks_like_path or not _REPO_ID.match(ref.model):
            raise SpecError(
                f"{role}.model: {ref.model!r} is neither an existing directory (relative paths are "
                f"resolved against {spec.source_dir}) nor a Hugging Face repo id like 'owner/name'",
                key_path=f"{role}.model",
                path=path,
            )


def _spec_error(exc: ValidationError, data: dict[str, Any], path: Path | None) -> SpecError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [str(part) for part in first["loc"]]
    key_path = ".".join(loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        section = _section_model(loc[:-1])
        known = ", ".join(section.model_fields) if section else ""
        message = f"{key_path}: unknown key; the keys here are: {known}"
    elif first["type"] == "missing":
        message = f"{key_path}: required key is missing"
    else:
        reason = first["msg"].removeprefix("Value error, ")
        if first["type"].startswith("value_error"):
            # A cross-field check: its message already names the values.
            message = f"{key_path or 'spec'}: {reason}"
        else:
            message = f"{key_path}: {reason}; got {_lookup(data, loc)!r}"
    more = len(errors) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return SpecError(message, key_path=key_path, path=path)


def _section_model(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = Spec
    for part in loc:
        field = model.model_fields.get(part)
        # An optional section (draft: ModelSpec | None) is its model.
        annotation = next((arg for arg in get_args(field.annotation) if arg is not type(None)), None) if field else None
        annotation = field.annotation if field and annotation is None else annotation
        if not isinstance(annotation, type) or not issubclass(annotation, BaseModel):
            return None
        model = annotation
    return model


def _lookup(data: Any, loc: list[str]) -> Any:
    for part in loc:
        if isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return None
    return data
