"""The model-config parameters of every model: one typed definition per model.

A config.pbtxt carries a model's parameters as strings
(``parameters { key: "max_draft_len" value { string_value: "4" } }``). Here each model's
parameters are one frozen dataclass whose field names are the keys and whose annotations are the
types. The repository's config builder writes them with :meth:`ModelParameters.to_config`; the
python models read them back with :meth:`ModelParameters.from_config`, which refuses a missing
or unknown key, so a renamed parameter fails when the model loads, naming the key, instead of
falling back to a silent default. :class:`TrtllmEngineParameters` are read by TensorRT-LLM's C++
backend, never by our code: they are typed here so that they too are written in one place.

Standard library only: this module is loaded inside Triton's python-backend stub.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from trt_spec.runtime import methods
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import StepCosts
from trt_spec.runtime.errors import GenerationParamsError, ModelParametersError
from trt_spec.runtime.methods import DEFAULT_MAX_NGRAM, DEFAULT_METHOD, DEFAULT_MIN_NGRAM

# The longest draft a spec may ask for (``speculative.num_draft_tokens``) and a request may send.
MAX_DRAFT_TOKENS = 16

# Keys Triton's python backend itself reads from a model's parameters (a custom execution
# environment, input tensor placement): a user may add them to any python model; not ours to check.
PYTHON_BACKEND_KEYS = frozenset({"EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS"})
NO_PRIOR_ALPHA = -1.0  # LoopParameters.prior_alpha: no measured prior (adaptive K starts uninformed)
_FIX = "rewrite the repository with `trt-spec repo --spec F` (the trt-spec that wrote it had other parameters)"

P = TypeVar("P", bound="ModelParameters")


def _bool_from_text(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(text)
    return value == "true"


_PARSERS: dict[type, Callable[[str], object]] = {str: str, int: int, float: float, bool: _bool_from_text}


def _text(value: object) -> str:
    """A parameter value as config.pbtxt holds it: bools as ``true``/``false``, the rest by ``str``."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class ModelParameters:
    """Base of every model's parameters: the fields are the config's keys, typed."""

    MODELS: ClassVar[tuple[str, ...]] = ()  # the models whose config carries these parameters

    def to_config(self) -> dict[str, dict[str, str]]:
        """Triton's form of the parameters, ``{key: {"string_value": text}}``, in field order."""
        return {field.name: {"string_value": _text(getattr(self, field.name))} for field in fields(self)}

    @classmethod
    def from_config(cls: type[P], model_config: Mapping[str, Any]) -> P:
        """The parameters of a model config as Triton hands it to ``initialize`` (the
        ``json.loads(args["model_config"])`` dict, whose ``parameters`` map each key to
        ``{"string_value": text}``), each parsed by its field's annotated type.

        Raises:
            ModelParametersError: a key is missing or unknown, or a value does not parse.
        """
        model = model_config.get("name") or " / ".join(cls.MODELS) or cls.__name__
        given = {
            key: value
            for key, value in (model_config.get("parameters") or {}).items()
            if key not in PYTHON_BACKEND_KEYS
        }
        types = typing.get_type_hints(cls)
        names = [field.name for field in fields(cls)]
        missing = [name for name in names if name not in given]
        unknown = sorted(key for key in given if key not in names)
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"no parameter {', '.join(repr(name) for name in missing)}")
            if unknown:
                problems.append(f"the unknown parameter {', '.join(repr(key) for key in unknown)}")
            raise ModelParametersError(
                f"{model}: config.pbtxt has {' and '.join(problems)} ({cls.__name__} takes {', '.join(names)}); {_FIX}"
            )
        values = {}
        for name in names:
            entry = given[name]
            # An empty string_value may be left out, as protobuf's JSON leaves out default values.
            text = entry.get("string_value", "") if isinstance(entry, Mapping) else None
            kind = types[name]
            try:
                if not isinstance(text, str):
                    raise ValueError(entry)
                values[name] = _PARSERS[kind](text)
            except ValueError:
                raise ModelParametersError(
                    f"{model}: config.pbtxt parameter {name!r} must be a {kind.__name__} string_value; "
                    f"got {entry!r}; {_FIX}"
                ) from None
        return cls(**values)


@dataclass(frozen=True)
class PreprocessingParameters(ModelParameters):
    MODELS: ClassVar[tuple[str, ...]] = (T.PREPROCESSING,)

    tokenizer_dir: str  # relative to the model's version directory (model.py's folder), or absolute
    add_special_tokens: bool  # when tokenizing the prompt (e.g. a BOS token)
    max_input_len: int  # the engines' longest prompt
    max_seq_len: int  # prompt + max_tokens
    max_draft_len: int  # K of the target engine: the most num_draft_tokens a request may ask for
    default_num_draft_tokens: int  # a request's num_draft_tokens when it sends none (the spec's K)
    vocab_size: int  # the largest top_k; end_id and pad_id must be below it
    # A request's exclude_input_in_output when it sends none (TensorRT-LLM takes it from the engine
    # model's parameter of that name; the repository writer sets both alike).
    exclude_input_in_output: bool
    # The loop verifies sampled drafts with the draft's logits (LoopParameters.use_draft_logits):
    # a request's use_draft_logits true is refused where it does not.
    draft_logits: bool


@dataclass(frozen=True)
class PostprocessingParameters(ModelParameters):
    MODELS: ClassVar[tuple[str, ...]] = (T.POSTPROCESSING,)

    tokenizer_dir: str  # relative to the model's version directory (model.py's folder), or absolute
    loop_model: str  # where a client's cancellation is relayed (see tensors.py on cancellation)


@dataclass(frozen=True)
class TrtllmPreprocessingParameters(ModelParameters):
    """TensorRT-LLM's ``preprocessing`` (its config's text-model keys), plus the prompt byte bound."""

    MODELS: ClassVar[tuple[str, ...]] = (T.TRTLLM_PREPROCESSING,)

    tokenizer_dir: str
    add_special_tokens: bool
    max_input_len: int  # a QUERY over what this many tokens can cover is refused untokenized


@dataclass(frozen=True)
class TrtllmPostprocessingParameters(ModelParameters):
    """TensorRT-LLM's ``postprocessing``."""

    MODELS: ClassVar[tuple[str, ...]] = (T.TRTLLM_POSTPROCESSING,)

    tokenizer_dir: str
    skip_special_tokens: bool


@dataclass(frozen=True)
class LoopParameters(ModelParameters):
    MODELS: ClassVar[tuple[str, ...]] = (T.LOOP,)

    target_model: str
    draft_model: str  # "" for a method without a draft model
    max_draft_len: int  # K of the target engine: the most drafts one verification takes
    adaptive_draft: bool  # choose K each step; the default when a request does not send adaptive_draft
    use_draft_logits: bool  # sampled requests verify with the draft's logits (rejection sampling)
    # Adaptive K's fixed step costs, relative to a target step (loop.StepCosts): t_d / t_1 and
    # what each verified position adds; from the plan, so that K depends on the tokens alone.
    draft_cost: float
    verify_slope: float
    # K by requests in flight: comma-separated, the K for 1, 2, ... requests in flight in the loop
    # model (the last one for more), 0 = plain decoding; "" = no schedule. Caps the K of requests
    # that send no num_draft_tokens (fixed or adaptive); a request that sends one keeps it.
    k_schedule: str = ""
    # Adaptive K's starting acceptance (StepCosts.prior_alpha, measured on the user's prompts);
    # NO_PRIOR_ALPHA (negative) = none: an uninformed start.
    prior_alpha: float = NO_PRIOR_ALPHA
    # The same run's acceptance per draft position (StepCosts.prior_profile): comma-separated
    # fractions accepted through positions 1, 2, ...; "" = none (adaptive K's E is i.i.d.).
    prior_profile: str = ""
    # Without use_draft_logits, sampled requests still speculate, verified by token matching (the
    # target's own sample at each position; exact in distribution where the target engine draws every
    # position from its distribution: the torch flavor's twin, as TensorRT-LLM's PyTorch backend does
    # on the llmapi route). False: they decode plainly (K = 0), as on TensorRT-LLM's C++ engines, whose
    # token matching is biased (bls.py). Only `serve`'s twin of an llmapi route sets it.
    sampled_token_match: bool = False
    # speculative.method (trt_spec.runtime.methods) and speculative.prompt_lookup's n-gram sizes.
    method: str = DEFAULT_METHOD
    lookup_min_ngram: int = DEFAULT_MIN_NGRAM
    lookup_max_ngram: int = DEFAULT_MAX_NGRAM
    vocab_size: int = 0  # the target's vocabulary: a lookup draft's one-hot draft_logits are this wide

    def __post_init__(self) -> None:
        model = " / ".join(self.MODELS)
        try:
            speculation = methods.get(self.method)
            methods.LookupParams(self.lookup_min_ngram, self.lookup_max_ngram)  # raises on sizes out of range
        except ValueError as exc:
            raise ModelParametersError(f"{model}: {exc}; {_FIX}") from None
        if speculation.uses_draft_model != bool(self.draft_model):
            raise ModelParametersError(
                f"{model}: method {self.method} {'needs' if speculation.uses_draft_model else 'has no'} a draft_model; "
                f"got {self.draft_model!r}; {_FIX}"
            )
        try:
            schedule = self.schedule
        except ValueError:
            raise ModelParametersError(
                f"{model}: k_schedule must be comma-separated integers (K per requests in flight) or empty; "
                f"got {self.k_schedule!r}; {_FIX}"
            ) from None
        if any(not 0 <= k <= self.max_draft_len for k in schedule):
            raise ModelParametersError(
                f"{model}: every K of k_schedule must be in 0..max_draft_len {self.max_draft_len}; "
                f"got {self.k_schedule!r}; {_FIX}"
            )
        if self.prior_alpha > 1 or self.prior_alpha != self.prior_alpha:
            raise ModelParametersError(
                f"{model}: prior_alpha must be in [0, 1], or negative for none; got {self.prior_alpha}; {_FIX}"
            )
        try:
            StepCosts(max(self.draft_cost, 0.0), max(self.verify_slope, 0.0), self.prior, self.profile)
        except (ValueError, GenerationParamsError) as exc:
            raise ModelParametersError(
                f"{model}: prior_profile must be comma-separated fractions accepted through positions 1, 2, ... "
                f"(each in [0, 1], none above the one before) with a prior_alpha; got {self.prior_profile!r} "
                f"({exc}); {_FIX}"
            ) from None

    @property
    def engines_return_logits(self) -> bool:
        """Both engines return ``generation_logits`` (TensorRT-LLM engines only when built with
        ``--gather_generation_logits``): the repository writer sets ``use_draft_logits`` exactly then."""
        return self.use_draft_logits

    @functools.cached_property
    def schedule(self) -> tuple[int, ...]:
        """``k_schedule`` as K for 1, 2, ... requests in flight; () = no schedule.

        Raises:
            ValueError: an entry that is not an integer.
        """
        return tuple(int(k) for k in self.k_schedule.split(",")) if self.k_schedule.strip() else ()

    def scheduled_k(self, in_flight: int) -> int | None:
        """The most K the schedule allows with ``in_flight`` requests in flight (the last entry
        beyond its length; 1 below 1); ``None`` without a schedule."""
        schedule = self.schedule
        if not schedule:
            return None
        return schedule[min(max(in_flight, 1), len(schedule)) - 1]

    @property
    def prior(self) -> float | None:
        """``prior_alpha``, or ``None`` for none (a negative value)."""
        return None if self.prior_alpha < 0 else self.prior_alpha

    @property
    def profile(self) -> tuple[float, ...]:
        """``prior_profile`` as fractions; () = none.

        Raises:
            ValueError: an entry that is not a number.
        """
        return tuple(float(value) for value in self.prior_profile.split(",")) if self.prior_profile.strip() else ()

    @property
    def speculation(self) -> methods.Method:
        return methods.get(self.method)

    @property
    def lookup(self) -> methods.LookupParams:
        """The prompt lookup's n-gram sizes.

        Raises:
            ValueError: sizes out of range.
        """
        return methods.LookupParams(self.lookup_min_ngram, self.lookup_max_ngram)

    def step_costs(self) -> StepCosts:
        """Adaptive K's fixed costs, prior and profile as this config gives them."""
        return StepCosts(self.draft_cost, self.verify_slope, self.prior, self.profile)

    @staticmethod
    def schedule_text(schedule: Sequence[int]) -> str:
        """A schedule (K for 1, 2, ... requests in flight) as ``k_schedule`` holds it."""
        return ",".join(str(int(k)) for k in schedule)


@dataclass(frozen=True)
class TorchEngineParameters(ModelParameters):
    """The torch flavor's engine models (the PyTorch twin behind TensorRT-LLM's tensors)."""

    MODELS: ClassVar[tuple[str, ...]] = (T.TARGET, T.DRAFT)

    role: str  # "target" | "draft"
    hf_model_dir: str  # the Hugging Face checkpoint the twin runs
    dtype: str  # the spec's engine.dtype: the precision the twin runs at (torch_engine.compute_dtypes)
    max_seq_len: int  # prompt + generated tokens (+ K on the target, as TensorRT-LLM's builder adds)
    max_draft_len: int  # the most draft_input_ids one request may send (0 on the draft)
    torch_threads: int  # intra-op threads; 0 = torch's default
    # rows one in-flight batching step may run (runtime/inflight_batcher.py): the plan's, as trtllm-build gets it
    max_num_tokens: int
    # output_log_probs renormalised over the top-k candidates, as TensorRT-LLM's parameter of this
    # name (engine_interface.token_log_probs)
    normalize_log_probs: bool


@dataclass(frozen=True)
class TrtllmEngineParameters(ModelParameters):
    """The tensorrtllm flavor's engine models: what TensorRT-LLM 1.2.x's C++ backend reads."""

    MODELS: ClassVar[tuple[str, ...]] = (T.TARGET, T.DRAFT)

    gpt_model_type: str
    gpt_model_path: str  # the engine directory as the server sees it
    max_beam_width: int
    batch_scheduler_policy: str
    max_tokens_in_paged_kv_cache: int
    kv_cache_free_gpu_mem_fraction: float
    enable_kv_cache_reuse: bool
    enable_chunked_context: bool
    exclude_input_in_output: bool
    normalize_log_probs: bool  # output_log_probs renormalised over the top-k candidates (upstream's default)
    gpu_device_ids: str  # comma-separated device numbers
    speculative_decoding_fast_logits: bool
    # Read with no default (a config without them fails to load), "" = no guided decoding:
    # triton_backend/inflight_batcher_llm/src/model_instance_state.cc, getGuidedDecodingConfigFromParams.
    tokenizer_dir: str
    xgrammar_tokenizer_info_path: str
    guided_decoding_backend: str
