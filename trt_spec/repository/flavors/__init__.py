"""Flavors: what runs the two engines of a repository, as a registry.

A flavor decides the engine models (``tensorrt_llm`` and ``tensorrt_llm_draft``: their configs and,
for python models, their source), adaptive K's step costs on its hardware, whether its engines
give the draft's logits for sampled verification, the loop's K by requests in flight (its K
schedule), what it checks before writing (built engines against the spec) and what it tells the
user after. Everything else of the repository (the pipeline around the engines) is the same for
every flavor (:func:`configs.pipeline_configs`), unless a flavor replaces it
(:meth:`Flavor.model_configs`). A flavor off the engine route (``llmapi``: TensorRT-LLM's PyTorch
backend) replaces the models and writes files of its own beside them (:meth:`Flavor.files`).

Each module of this package that defines ``FLAVOR`` (a :class:`Flavor`) is a flavor: adding one is
one new module here (docs/contributing.md, "Adding a flavor"). The spec names the flavor
(``triton.flavor``); the names here and the spec's choices are the same (a test says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from trt_spec.errors import RepositoryError
from trt_spec.layout import engine_dir
from trt_spec.plan import Plan, Route, engine_route
from trt_spec.plan.projection import DEFAULT_ALPHA
from trt_spec.repository import configs
from trt_spec.repository.configs import EngineSettings, ModelConfig, RepositorySettings
from trt_spec.repository.twin_routes import SAMPLED_VERIFICATIONS as SAMPLED_VERIFICATIONS
from trt_spec.repository.twin_routes import TwinRoute  # own module: readers (llmapi_twin) skip this registry
from trt_spec.runtime import tensors as T
from trt_spec.runtime.costs import Acceptance, AcceptanceProfile, StepCosts, alpha_of
from trt_spec.runtime.registry import discover
from trt_spec.spec import Spec


class Flavor:
    """One way to run the engines. Subclasses set the class attributes and the engine config."""

    name: ClassVar[str]  # the spec's triton.flavor value
    summary: ClassVar[str]  # one line: what runs the engines, and where
    needs_draft_checkpoint: ClassVar[bool] = False  # the engines read the draft's HF checkpoint
    engine_source: ClassVar[str | None] = None  # the packaged model.py folder of python engine models
    needs_tokenizer: ClassVar[bool] = True  # the repository carries the target's tokenizer files
    root_files: ClassVar[tuple[str, ...]] = ()  # files this flavor writes at the repository's root (files())
    # Runs on the kind of machine `trt-spec tune` measures on (the PyTorch twin): a tuning report's
    # measured step costs apply to it; a GPU flavor keeps its projected ones.
    uses_measured_step_costs: ClassVar[bool] = False
    takes_trtllm_version: ClassVar[bool] = False  # files() depend on the TensorRT-LLM release line
    # How a deployment runs this flavor's repository (``trt-spec k8s``: trt_spec/deploy keys its server
    # container, image, probes and autoscaling by it): "tritonserver" (NVIDIA's Triton TensorRT-LLM
    # container, orchestrator mode), "trt-spec-serve" (`trt-spec serve` in the trt-spec image),
    # "trtllm-serve" (TensorRT-LLM's release container).
    launcher: ClassVar[str] = "trt-spec-serve"
    needs_gpus: ClassVar[bool] = False  # a deployment asks for the plan's GPUs (else it runs on CPU)

    def step_costs(self, plan: Plan) -> StepCosts:
        """Adaptive K's fixed step costs on this flavor's hardware (fixed: runtime/costs.py says why)."""
        raise NotImplementedError

    def k_schedule(self, plan: Plan, acceptance: Acceptance) -> tuple[int, ...]:
        """The loop's K by requests in flight (1 .. max_batch_size) on this flavor's hardware at
        ``acceptance``; () = none: every request keeps its K whatever the load."""
        return ()

    def gives_draft_logits(self, acceptance: str) -> bool:
        """Whether sampled requests can verify with the draft's logits (else the target matches tokens)."""
        raise NotImplementedError

    def engine_config(self, settings: RepositorySettings, role: str) -> ModelConfig:
        """The engine model of ``role`` ("target" or "draft")."""
        raise NotImplementedError

    def model_configs(self, settings: RepositorySettings) -> dict[str, ModelConfig]:
        """Every model of the repository, by name: the shared pipeline around this flavor's engines."""
        engines = {T.ENGINE_MODELS[role]: self.engine_config(settings, role) for role in settings.roles}
        return configs.pipeline_configs(settings, engines)

    def source(self, model: str) -> str | None:
        """The packaged folder (under ``trt_spec/runtime/models/``) of a python model's ``model.py``;
        None: the model's source is not ours (the writer copies no ``model.py`` nor runtime for it)."""
        return self.engine_source if self.engine_source and model in T.ENGINE_MODELS.values() else model

    def files(self, plan: Plan, settings: RepositorySettings, *, trtllm_version: str | None = None) -> dict[str, str]:
        """Files of this flavor's own beyond the model configs, by path relative to the repository
        (a model's version folder, or a name in ``root_files``), written with the rest and as
        atomically. ``trtllm_version``: the TensorRT-LLM release line to write them for (None: the
        flavor's default).

        Raises:
            RepositoryError: a file would not validate.
        """
        return {}

    def next_step(self, repo: Path) -> str:
        """What to run once the repository is written."""
        return f"trt-spec serve --repo {repo}"

    def route(self, spec: Spec) -> Route:
        """How this flavor takes the plan to a GPU, as ``plan`` and ``check`` say it (make_plan's
        ``route``): the engine route unless the flavor builds no engines."""
        return engine_route(spec)

    def check(self, plan: Plan, settings: RepositorySettings) -> list[str]:
        """Cross-check what was built for the spec before writing; notes for the caller to show.

        Raises:
            EngineMismatchError: a built artefact disagrees with the spec.
        """
        return []

    def notes(self, settings: RepositorySettings, repo: Path) -> list[str]:
        """What to tell the user about the written repository."""
        return []

    def twin_route(self, repo: Path) -> TwinRoute | None:
        """``repo`` read as a repository of this flavor that ``serve`` runs on the PyTorch twin
        instead of as written (its own server is not Triton); None: not one (Triton serves it as
        written). Cheap when it is not one.

        Raises:
            RepositoryError: it is one, and its files would be refused (names the file and the key).
        """
        return None


def _discover() -> dict[str, Flavor]:
    return discover(__name__, __path__, "FLAVOR", Flavor)


FLAVORS: dict[str, Flavor] = _discover()
# What a repository's root may hold besides its models: every flavor's root files.
ROOT_FILES: tuple[str, ...] = tuple(sorted({name for flavor in FLAVORS.values() for name in flavor.root_files}))


def twin_route(repo: str | Path) -> TwinRoute | None:
    """The twin ``serve`` runs for ``repo`` (:meth:`Flavor.twin_route`), asked of every flavor;
    None: Triton serves the repository as written.

    Raises:
        RepositoryError: a flavor's repository whose files would be refused.
    """
    for flavor in FLAVORS.values():
        route = flavor.twin_route(Path(repo))
        if route is not None:
            return route
    return None


def get(name: str) -> Flavor:
    """The flavor called ``name``.

    Raises:
        RepositoryError: no such flavor (names the choices).
    """
    try:
        return FLAVORS[name]
    except KeyError:
        raise RepositoryError(f"flavor must be one of {', '.join(FLAVORS)}; got {name!r}") from None


def settings_from_plan(
    plan: Plan,
    *,
    flavor: str | None = None,
    engines_mount: str | Path | None = None,
    hf_model_dirs: dict[str, str] | None = None,
    adaptive_draft: bool = False,
    torch_threads: int = 1,
    acceptance: Acceptance | None = None,
    step_costs: StepCosts | None = None,
    k_schedule: Sequence[int] | None = None,
    sampled_token_match: bool = False,
) -> RepositorySettings:
    """The repository's settings from the plan alone, in ``flavor`` (default: the spec's).

    ``engines_mount``: the spec's ``paths.engines`` as the serving machine sees it (e.g. a
    container mount point); default: the absolute local path. ``adaptive_draft``: the loop's
    default for requests that do not say. ``torch_threads``: the torch flavor's intra-op threads
    per engine model (0 = torch's default). One by default: a request keeps one engine busy at a
    time, the server's other processes (loop, postprocessing, Triton itself) need the remaining
    cores, and idle OpenMP threads spin-waiting on a shared CPU slow everything else down.

    ``acceptance``: measured on the user's prompts (``trt-spec tune``: an alpha or a per-position
    profile): the flavor's K schedule is made at it and adaptive K starts from its alpha
    (``StepCosts.prior_alpha``); ``None``: the schedule at the projection's default alpha
    (``projection.DEFAULT_ALPHA``) and no prior. ``step_costs``: adaptive K's fixed costs instead
    of the flavor's (``Flavor.step_costs``). ``k_schedule``: the loop's K by requests in flight
    instead of the flavor's (``Flavor.k_schedule``); ``()`` = none. ``sampled_token_match``: sampled
    requests verify by token matching, without the draft's logits (``LoopParameters.sampled_token_match``).

    Raises:
        RepositoryError: an unknown flavor, or a K schedule that does not fit the engines.
    """
    spec = plan.spec
    chosen = get(flavor or spec.triton.flavor)
    fractions = configs.kv_cache_fractions(plan)
    costs = step_costs if step_costs is not None else chosen.step_costs(plan)
    schedule_acceptance: Acceptance = DEFAULT_ALPHA
    if acceptance is not None:
        profile = acceptance.accepted_through if isinstance(acceptance, AcceptanceProfile) else ()
        costs = dataclasses.replace(costs, prior_alpha=alpha_of(acceptance), prior_profile=profile)
        schedule_acceptance = acceptance
    engines = {}
    for role in spec.roles:
        local = engine_dir(spec, role)
        served = str(Path(engines_mount) / spec.name / role) if engines_mount is not None else str(local.resolve())
        engines[role] = EngineSettings(
            role=role,
            engine_dir=served,
            hf_model_dir=(hf_model_dirs or {}).get(role),
            tp_size=spec.role(role).tp_size,
            kv_tokens=plan.memory.kv_tokens,
            kv_fraction=fractions[role],
            max_num_tokens=plan.engine(role).max_num_tokens,
        )
    return RepositorySettings(
        name=spec.name,
        flavor=chosen.name,
        max_batch_size=spec.engine.max_batch_size,
        max_input_len=spec.engine.max_input_len,
        max_seq_len=spec.engine.max_seq_len,
        max_draft_len=spec.num_draft_tokens,
        dtype=spec.engine.dtype,
        default_num_draft_tokens=spec.num_draft_tokens,
        acceptance=spec.speculative.acceptance,
        vocab_size=plan.target.model.vocab_size,
        target=engines["target"],
        draft=engines.get("draft"),
        method=spec.speculative.method,
        lookup=spec.speculative.prompt_lookup.params,
        adaptive_draft=adaptive_draft,
        torch_threads=torch_threads,
        step_costs=costs,
        draft_logits=not sampled_token_match and chosen.gives_draft_logits(spec.speculative.acceptance),
        sampled_token_match=sampled_token_match,
        k_schedule=tuple(k_schedule) if k_schedule is not None else chosen.k_schedule(plan, schedule_acceptance),
    )


def model_configs(settings: RepositorySettings) -> dict[str, ModelConfig]:
    """Every model of the repository in the settings' flavor, by name."""
    return get(settings.flavor).model_configs(settings)


def engine_config(settings: RepositorySettings, role: str) -> ModelConfig:
    """The engine model of ``role`` in the settings' flavor."""
    return get(settings.flavor).engine_config(settings, role)
