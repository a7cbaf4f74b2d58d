"""The ``llmapi`` flavor: the spec served by TensorRT-LLM's PyTorch backend through its LLM API, the
route after TensorRT engines (upstream removed the engine path and its C++ Triton backend after 1.2.x).

Named after what users of TensorRT-LLM meet on this route: the LLM API (``--extra_llm_api_options`` /
``--config`` of ``trtllm-serve``) and Triton's ``llmapi`` python model
(``triton_backend/all_models/llmapi/``); "pytorch" would read too close to our ``torch`` flavor, the
PyTorch twin of the engines.

The repository it writes (docs/llmapi.md):

- ``trtllm-serve.yaml``: the LLM-API options (tp, batch, ``max_num_tokens`` >= max_batch_size x (K + 1),
  ``max_seq_len``, the memory plan's KV budget, ``speculative_config`` with the draft and K, the
  scheduler and CUDA-graph settings of upstream's draft-target examples), validated against the key
  table of the chosen TensorRT-LLM line (:mod:`trt_spec.repository.llm_args`);
- ``trtllm-serve.sh``: the exact ``trtllm-serve`` command (OpenAI API, ``/health``, ``/metrics``);
- ``tensorrt_llm/``: Triton's llmapi model, ``config.pbtxt`` (upstream's inputs and outputs, parsed
  through Triton's protobuf like every config here) and ``1/model.yaml`` (the same LLM arguments plus
  ``triton_config``: decoupled, so it streams). Its ``model.py`` is upstream's and is not copied.

No draft -> verify loop of ours runs here: TensorRT-LLM speculates inside its executor, with K fixed
by ``max_draft_len`` (:meth:`LlmApiFlavor.route` lists what else differs).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from google.protobuf import text_format

from trt_spec.errors import NotDownloadedError, RepositoryError
from trt_spec.plan import Plan, Route
from trt_spec.repository import configs, llm_args
from trt_spec.repository.configs import ModelConfig, RepositorySettings
from trt_spec.repository.flavors import Flavor, TwinRoute
from trt_spec.repository.llmapi_layout import (
    COMMAND_FILE,
    HOST,
    LLMAPI_FLAVOR,
    MODEL,
    MODEL_YAML,
    OPTIONS_FILE,
    OPTIONS_FLAG,
    PORT,
)
from trt_spec.repository.llmapi_twin import read_route
from trt_spec.runtime.costs import DEFAULT_STEP_COSTS, StepCosts
from trt_spec.spec import Spec

# The repository's file names, trtllm-serve's flags, host and port (LLMAPI_FLAVOR ... PORT) are in
# llmapi_layout.py, shared with the reader of what is written here (llmapi_twin.py); imported from
# here as before.

# Triton's llmapi model: one instance (it drives the GPUs itself, via MPI for tp > 1), no batching of
# requests by Triton (upstream: "The current implementation does not support batching"), decoupled so
# a request may stream. Source: triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml and
# config.pbtxt @c8c6df08bd0ead54cd47f7973e1e425c28a174cd; model.py reads triton_config at load
# (auto_complete_config) and upstream asks that max_batch_size and decoupled stay out of config.pbtxt.
TRITON_CONFIG = {"max_batch_size": 0, "decoupled": True}
# The llmapi model's inputs and outputs, as upstream's config.pbtxt @c8c6df08 declares them (text
# format, parsed through Triton's protobuf): not the ensemble's (text_input is [-1] strings, sampling
# parameters are sampling_param_*; the outputs carry the speculation counters). Upstream's interface,
# which no model of ours speaks: kept here as upstream's text rather than in runtime/tensors.py (the
# contracts between our own processes).
TRITON_IO = """
input { name: "text_input" data_type: TYPE_STRING dims: -1 }
input { name: "streaming" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "sampling_param_best_of" data_type: TYPE_INT32 dims: 1 optional: true }
input { name: "sampling_param_temperature" data_type: TYPE_FP32 dims: 1 optional: true }
input { name: "sampling_param_top_k" data_type: TYPE_INT32 dims: 1 optional: true }
input { name: "sampling_param_top_p" data_type: TYPE_FP32 dims: 1 optional: true }
input { name: "sampling_param_frequency_penalty" data_type: TYPE_FP32 dims: 1 optional: true }
input { name: "sampling_param_presence_penalty" data_type: TYPE_FP32 dims: 1 optional: true }
input { name: "sampling_param_max_tokens" data_type: TYPE_INT32 dims: 1 optional: true }
input { name: "sampling_param_stop" data_type: TYPE_STRING dims: -1 optional: true }
input { name: "sampling_param_seed" data_type: TYPE_UINT64 dims: 1 optional: true }
input { name: "sampling_param_exclude_input_from_output" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "sampling_param_return_perf_metrics" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "return_finish_reason" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "return_stop_reason" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "return_cumulative_logprob" data_type: TYPE_BOOL dims: 1 optional: true }
input { name: "stop" data_type: TYPE_BOOL dims: 1 optional: true }
output { name: "text_output" data_type: TYPE_STRING dims: -1 }
output { name: "finish_reason" data_type: TYPE_STRING dims: -1 }
output { name: "stop_reason" data_type: TYPE_STRING dims: -1 }
output { name: "cumulative_logprob" data_type: TYPE_FP32 dims: -1 }
output { name: "kv_cache_reused_block" data_type: TYPE_INT32 dims: -1 }
output { name: "kv_cache_missed_block" data_type: TYPE_INT32 dims: -1 }
output { name: "kv_cache_alloc_new_blocks" data_type: TYPE_INT32 dims: -1 }
output { name: "kv_cache_alloc_total_blocks" data_type: TYPE_INT32 dims: -1 }
output { name: "kv_cache_hit_rate" data_type: TYPE_FP32 dims: -1 }
output { name: "arrival_time_ns" data_type: TYPE_INT64 dims: 1 }
output { name: "first_scheduled_time_ns" data_type: TYPE_INT64 dims: 1 }
output { name: "first_token_time_ns" data_type: TYPE_INT64 dims: 1 }
output { name: "last_token_time_ns" data_type: TYPE_INT64 dims: 1 }
output { name: "acceptance_rate" data_type: TYPE_FP32 dims: 1 }
output { name: "total_accepted_draft_tokens" data_type: TYPE_INT32 dims: 1 }
output { name: "total_draft_tokens" data_type: TYPE_INT32 dims: 1 }
"""

# The speculative_config decoding types this flavor writes (llm_args.py models their keys).
WRITTEN_DECODING_TYPES = ("Draft_Target", "NGram")


class LlmApiFlavor(Flavor):
    name = LLMAPI_FLAVOR
    summary = "TensorRT-LLM's PyTorch backend (LLM API): trtllm-serve, or Triton's llmapi model; no engines"
    needs_tokenizer = False  # the LLM API reads the tokenizer from the target's checkpoint
    root_files = (OPTIONS_FILE, COMMAND_FILE)
    takes_trtllm_version = True
    launcher = "trtllm-serve"  # TensorRT-LLM's release container (trt_spec/deploy)
    needs_gpus = True

    def next_step(self, repo: Path) -> str:
        return f"on a GPU machine with TensorRT-LLM, sh {repo}/{COMMAND_FILE} (or Triton on {repo})"

    def route(self, spec: Spec) -> Route:
        """What this route does differently from the engine route, so that ``check`` and ``plan``
        say it before the user picks it. Sources: docs/llmapi.md (upstream's llm_args.py and
        sampler, cited there)."""
        k, tp = spec.num_draft_tokens, spec.target.tp_size
        if spec.method.uses_lookup:
            return self._ngram_route(spec)
        warnings = []
        if spec.draft is not None and spec.draft.tp_size != tp:
            warnings.append(
                f"llmapi route: the draft runs at the target's tp {tp}, not draft.tp_size {spec.draft.tp_size} "
                "(TensorRT-LLM's PyTorch backend runs it with the target's parallel mapping); the memory plan "
                f"still places it at tp {spec.draft.tp_size}"
            )
        notes = (
            f"llmapi route: K is fixed at max_draft_len {k} for every request; a request's num_draft_tokens, "
            "adaptive K and the K schedule by load are not available (TensorRT-LLM's PyTorch backend drafts "
            "max_draft_len tokens per step)",
            "llmapi route, acceptance: TensorRT-LLM 1.2.x (two-model draft-target) verifies greedy requests by "
            "exact match and sampled ones by rejection sampling when the draft's logits are kept; 1.3+ runs "
            "draft-target as one model and verifies non-greedy batches by exact match unless "
            "use_rejection_sampling is true (prototype, needs FlashInfer), which trt-spec writes for acceptance: "
            f"probabilistic (this spec: {spec.speculative.acceptance})",
            f"llmapi route: tensor parallel {tp} for target and draft, no pipeline parallelism with speculation "
            "(pipeline_parallel_size 1), overlap scheduler off (disable_overlap_scheduler: true, as upstream's "
            "draft-target examples run)",
        )
        return Route("llmapi route", tuple(warnings), notes, builds_engines=False)

    def _ngram_route(self, spec: Spec) -> Route:
        """Prompt lookup as TensorRT-LLM's PyTorch backend runs it (NGram; docs/llmapi.md)."""
        lookup = spec.speculative.prompt_lookup
        warnings = []
        if lookup.min_ngram != 1:
            warnings.append(
                f"llmapi route: speculative.prompt_lookup.min_ngram {lookup.min_ngram} is not written: TensorRT-LLM's "
                "NGram matches suffixes down to 1 token (no minimum); drafts differ, outputs do not"
            )
        notes = (
            f"llmapi route: NGram with max_draft_len {spec.num_draft_tokens} and max_matching_ngram_size "
            f"{lookup.max_ngram}, per-request pools, the newest match (is_public_pool and is_use_oldest false, "
            "upstream's defaults being true); K is fixed at max_draft_len for every request",
            "llmapi route, acceptance: NGram drafts carry no logits, so TensorRT-LLM's TorchSampler verifies them by "
            "exact token match (_process_draft_tokens_greedy), which for a point-mass draft is exact also for "
            "sampled requests; use_rejection_sampling is refused for NGram upstream and not written",
            "llmapi route: overlap scheduler off (disable_overlap_scheduler: true; upstream turns it off for NGram)",
        )
        return Route("llmapi route", tuple(warnings), notes, builds_engines=False)

    def step_costs(self, plan: Plan) -> StepCosts:
        """Unused: no loop of ours runs on this route (TensorRT-LLM speculates with a fixed K)."""
        return DEFAULT_STEP_COSTS

    def gives_draft_logits(self, acceptance: str) -> bool:
        return False  # no loop of ours asks for them

    def engine_config(self, settings: RepositorySettings, role: str) -> ModelConfig:
        raise RepositoryError("the llmapi flavor has no engine models: TensorRT-LLM runs target and draft itself")

    def model_configs(self, settings: RepositorySettings) -> dict[str, ModelConfig]:
        """Triton's llmapi model only (its model.yaml: :meth:`files`)."""
        return {MODEL: triton_config()}

    def source(self, model: str) -> str | None:
        return None  # upstream's model.py (notes() says where it comes from)

    def files(self, plan: Plan, settings: RepositorySettings, *, trtllm_version: str | None = None) -> dict[str, str]:
        _require_written_method(plan.spec)
        version = llm_args.version_line(trtllm_version or llm_args.DEFAULT_TRTLLM_VERSION)
        label = llm_args.VERSION_LABELS[version]
        options = llm_options(plan, version)
        model_yaml = {"model": checkpoint(plan, "target"), "backend": "pytorch", **options}
        model_yaml["triton_config"] = dict(TRITON_CONFIG)
        llm_args.validate_options(options, version, "options")
        llm_args.validate_options(model_yaml, version, "model_yaml")
        header = (
            f"# Written by `trt-spec repo --flavor llmapi` for spec {plan.spec.name!r}, TensorRT-LLM {label}; keys\n"
            "# checked against trt_spec/repository/llm_args.py (docs/llmapi.md).\n"
        )
        return {
            OPTIONS_FILE: header + "# The LLM-API options of trtllm-serve.sh.\n" + _dump(options),
            MODEL_YAML: header + "# Triton's llmapi model: the LLM arguments plus triton_config.\n" + _dump(model_yaml),
            COMMAND_FILE: command_script(plan, version),
        }

    def check(self, plan: Plan, settings: RepositorySettings) -> list[str]:
        _require_written_method(plan.spec)
        route = self.route(plan.spec)
        warnings, notes = route.warnings, route.notes
        hub = [f"{role} {plan.spec.role(role).model}" for role in plan.roles if _hub_only(plan, role)]
        if hub:
            notes = (
                *notes,
                f"{' and '.join(hub)} not downloaded: the files name the Hub id(s), which TensorRT-LLM downloads "
                "at their default revision, not a revision the spec pins; run `trt-spec download` and `repo` again to "
                "name the downloaded snapshot",
            )
        return [*warnings, *notes]

    def twin_route(self, repo: Path) -> TwinRoute | None:
        """A repository with ``trtllm-serve.yaml``, read as trtllm-serve would read it, for ``serve``
        to run on the PyTorch twin (:mod:`trt_spec.repository.llmapi_twin`)."""
        if not (repo / OPTIONS_FILE).is_file():
            return None
        return read_route(repo)

    def notes(self, settings: RepositorySettings, repo: Path) -> list[str]:
        return [
            f"llmapi flavor: serve with `{repo / COMMAND_FILE}` (trtllm-serve: OpenAI API, /health, /metrics), "
            f"options in {repo / OPTIONS_FILE}",
            f"or with Triton: {repo / MODEL} is upstream's llmapi model (config.pbtxt, 1/model.yaml); put upstream's "
            "model.py and helpers.py (triton_backend/all_models/llmapi/tensorrt_llm/1/ of the TensorRT-LLM release "
            f"you serve) into {repo / MODEL / '1'}",
        ]


FLAVOR = LlmApiFlavor()


def checkpoint(plan: Plan, role: str) -> str:
    """The role's Hugging Face checkpoint as the LLM API takes it: the local directory or the
    downloaded snapshot (absolute), else the Hub id (TensorRT-LLM downloads it)."""
    spec = plan.spec
    local = spec.role(role).local_dir(spec.source_dir)
    if local is not None:
        return str(local.resolve())
    from trt_spec.checkpoints.download import local_snapshot

    try:
        return str(local_snapshot(spec, role).path)
    except NotDownloadedError:
        return spec.role(role).model


def _hub_only(plan: Plan, role: str) -> bool:
    return (
        checkpoint(plan, role) == plan.spec.role(role).model
        and plan.spec.role(role).local_dir(plan.spec.source_dir) is None
    )


def llm_options(plan: Plan, version: str) -> dict:
    """The LLM-API options for ``plan`` on ``version``'s line (a line of ``llm_args.TRTLLM_VERSIONS``)."""
    spec = plan.spec
    engine = spec.engine
    k = spec.num_draft_tokens
    speculative: dict = {"decoding_type": spec.method.llmapi_decoding_type, "max_draft_len": k}
    if spec.method.uses_lookup:
        speculative.update(ngram_options(spec))
    else:
        speculative[llm_args.DRAFT_MODEL_KEY[version]] = checkpoint(plan, "draft")
    if version == "1.3" and spec.method.uses_draft_model:
        # 1.3+ runs draft-target as one model, whose non-greedy batches verify by exact match unless
        # asked (llm_args.py @0004396: use_rejection_sampling, prototype, needs FlashInfer).
        speculative["use_rejection_sampling"] = spec.speculative.acceptance == "probabilistic"
    return {
        "tensor_parallel_size": spec.target.tp_size,  # the draft runs at the target's tp on this route
        "pipeline_parallel_size": 1,  # no pipeline parallelism with speculation
        "max_batch_size": engine.max_batch_size,
        # plan.max_num_tokens: >= max_batch_size x (K + 1), a full batch verifying in one step
        "max_num_tokens": plan.target.max_num_tokens,
        "max_seq_len": engine.max_seq_len,
        "dtype": engine.dtype,
        "trust_remote_code": _trusts_remote_code(spec),
        # The memory plan's KV budget (plan/memory.py), as for the engine route
        # (configs.kv_cache_fractions); block reuse off as in upstream's draft-target examples
        # (tests/unittest/_torch/speculative/hw_agnostic/test_draft_target.py @1a43c7d62d008ca9d1efdfd50f9180390598d314).
        "kv_cache_config": llm_args.KvCacheConfig(
            enable_block_reuse=False,
            max_tokens=plan.memory.kv_tokens,
            free_gpu_memory_fraction=configs.kv_cache_fractions(plan)["target"],
        ).model_dump(exclude_none=True),
        # test_draft_target.py @1a43c7d: CudaGraphConfig(batch_sizes=[1, max_batch_size]),
        # disable_overlap_scheduler=True (also the 1.4 docs' draft/target example).
        "cuda_graph_config": llm_args.CudaGraphConfig(batch_sizes=sorted({1, engine.max_batch_size})).model_dump(
            exclude_none=True
        ),
        "disable_overlap_scheduler": True,
        "speculative_config": speculative,
    }


def ngram_options(spec: Spec) -> dict:
    """``NGramDecodingConfig``'s pool options for trt-spec's matcher (runtime/methods/prompt_lookup.py):
    suffixes of ``max_ngram`` tokens down to 1, the most recent match, each request matched against
    its own tokens only. Upstream's pool (tensorrt_llm/_torch/speculative/ngram.py @0249976575050d2c624a5f285683c66de311a3b7,
    ``NGramPoolManager.get_draft_tokens``) tries sizes min(max_matching_ngram_size, len - 1) down to 1
    and takes ``pool[pattern][0 if is_use_oldest else -1]``; its defaults (oldest match, one pool
    shared by every request) would propose text from other requests."""
    return {
        "max_matching_ngram_size": spec.speculative.prompt_lookup.max_ngram,
        "is_keep_all": True,
        "is_use_oldest": False,
        "is_public_pool": False,
    }


def serve_argv(plan: Plan, version: str, options_path: str) -> list[str]:
    """The ``trtllm-serve`` command for ``plan`` with its options at ``options_path``. The options
    file overrides the flags (serve.py: update_llm_args_with_extra_dict), which repeat its limits
    so the command line shows them."""
    spec = plan.spec
    argv = [
        "trtllm-serve",
        checkpoint(plan, "target"),
        "--backend", "pytorch",
        "--host", HOST,
        "--port", str(PORT),
        "--tp_size", str(spec.target.tp_size),
        "--pp_size", "1",
        "--max_batch_size", str(spec.engine.max_batch_size),
        "--max_num_tokens", str(plan.target.max_num_tokens),
        "--max_seq_len", str(spec.engine.max_seq_len),
    ]  # fmt: skip
    if _trusts_remote_code(spec):
        argv.append("--trust_remote_code")
    return [*argv, OPTIONS_FLAG[llm_args.version_line(version)], options_path]


def command_script(plan: Plan, version: str) -> str:
    """``trtllm-serve.sh``: the command, reading the options file beside it (relocatable); extra
    arguments pass through (``--host 0.0.0.0``, ``--port N``)."""
    argv = [shlex.quote(arg) for arg in serve_argv(plan, version, "__OPTIONS__")]
    lines, rest = [" ".join(argv[:2])], argv[2:]
    while rest:  # one option (and its value) a line
        take = 2 if len(rest) > 1 and not rest[1].startswith("--") else 1
        lines.append(" ".join(rest[:take]))
        rest = rest[take:]
    command = " \\\n  ".join(lines).replace("__OPTIONS__", f'"$here/{OPTIONS_FILE}"')
    return (
        "#!/usr/bin/env bash\n"
        f"# Written by `trt-spec repo --flavor llmapi` for spec {plan.spec.name!r}, TensorRT-LLM "
        f"{llm_args.VERSION_LABELS[llm_args.version_line(version)]}: serves the spec on TensorRT-LLM's PyTorch "
        "backend\n# (OpenAI API, /health, /metrics). Extra arguments are passed to trtllm-serve.\n"
        "set -euo pipefail\n"
        'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
        f'exec {command} \\\n  "$@"\n'
    )


def triton_config() -> ModelConfig:
    """Upstream's llmapi ``config.pbtxt``, through Triton's protobuf (a bad field fails here)."""
    config = configs.to_model_config(
        {"name": MODEL, "backend": "python", "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
    )
    try:
        text_format.Merge(TRITON_IO, config)
    except text_format.ParseError as exc:
        raise RepositoryError(f"the llmapi model's inputs and outputs do not parse: {exc}") from None
    return config


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _trusts_remote_code(spec: Spec) -> bool:
    return spec.target.trust_remote_code or (spec.draft is not None and spec.draft.trust_remote_code)


def _require_written_method(spec: Spec) -> None:
    """Refuse a method whose ``speculative_config`` this flavor does not write.

    Raises:
        RepositoryError: names the method and the flavors that serve it.
    """
    method = spec.method
    if method.llmapi_decoding_type not in WRITTEN_DECODING_TYPES:
        # hybrid has no counterpart upstream.
        raise RepositoryError(
            f"speculative.method {method.name}: the llmapi flavor writes {' and '.join(WRITTEN_DECODING_TYPES)} "
            "options only; serve this spec with triton.flavor tensorrtllm (GPU engines) or torch "
            "(`trt-spec repo --flavor torch`)"
        )
