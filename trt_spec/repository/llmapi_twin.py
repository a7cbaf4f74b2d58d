"""An llmapi-flavor repository read back as ``trtllm-serve`` would read it, for ``serve`` to run on
the PyTorch twin (:class:`~trt_spec.repository.twin_routes.TwinRoute`).

What is read, and from where:

- the TensorRT-LLM line: ``trtllm-serve.sh``'s options flag (``--extra_llm_api_options``: 1.2.x,
  ``--config``: 1.3+, :data:`~trt_spec.repository.flavors.llmapi.OPTIONS_FLAG`), else the header
  ``repo`` writes into ``trtllm-serve.yaml``, else the one line whose key table takes the file (both:
  1.3+, upstream's current line, said in a note);
- ``trtllm-serve.yaml`` validated against that line's key table
  (:func:`~trt_spec.repository.llm_args.validate_yaml`): a misspelled or other-version key is refused
  by its path, as the LLM API refuses it (``StrictBaseModel``) when the real server starts;
- NGram (``decoding_type: NGram``): prompt lookup with suffixes of ``max_matching_ngram_size``
  down to 1 token and no draft model, sampled drafts verified by exact token match (a point mass:
  exact);
- the target: ``trtllm-serve.sh``'s model argument (what trtllm-serve loads), else ``model`` of
  ``tensorrt_llm/1/model.yaml`` (Triton's llmapi model; validated as such); the draft:
  ``speculative_config.speculative_model`` (or ``speculative_model_dir``); K: ``max_draft_len``;
  ``max_batch_size``, ``max_seq_len``, ``tensor_parallel_size``, ``dtype`` and ``trust_remote_code``
  from the options; relative paths against the current directory, as trtllm-serve takes them;
- how sampled drafts are verified: 1.2.x by rejection sampling (two-model draft-target on the
  ``TorchSampler``, the draft's logits kept); 1.3+ by rejection sampling with
  ``use_rejection_sampling: true``, else by exact token match (docs/llmapi.md cites the sources);
  greedy requests by exact match on every line;
- the served model name and port: trtllm-serve's (below).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from trt_spec.errors import RepositoryError, SpecError
from trt_spec.repository import llm_args
from trt_spec.repository.llmapi_layout import COMMAND_FILE, LLMAPI_FLAVOR, MODEL_YAML, OPTIONS_FILE, OPTIONS_FLAG, PORT
from trt_spec.repository.twin_routes import TwinRoute
from trt_spec.runtime.parameters import MAX_DRAFT_TOKENS
from trt_spec.spec import Spec, SpeculativeSpec, parse_spec

_LINE_OF_FLAG = {flag: line for line, flag in OPTIONS_FLAG.items()}
_HEADER = re.compile(
    r"^# Written by `trt-spec repo --flavor llmapi` for spec '(?P<name>[^']+)', TensorRT-LLM (?P<label>\S+);"
)
_LINE_OF_LABEL = {label: line for line, label in llm_args.VERSION_LABELS.items()}
_SPEC_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# The twin's engine dtype: the spec takes the GPU dtypes only; on CPU the twin computes in float32 whatever it says.
_SPEC_DTYPES = ("float16", "bfloat16")


def read_route(repo: Path) -> TwinRoute:
    """``repo``'s llmapi route as trtllm-serve would run it (the module docstring says what is read).

    Raises:
        LlmArgsError: ``trtllm-serve.yaml`` (or ``model.yaml``) has a key or value the line refuses
            (names the file and the key path).
        RepositoryError: no target named, a line that cannot be told, or limits the twin cannot take.
    """
    repo = Path(repo)
    options_path = repo / OPTIONS_FILE
    command = _command(repo / COMMAND_FILE)
    header = _HEADER.match(options_path.read_text())
    notes: list[str] = []
    if command.get("flag") is not None:
        version = _LINE_OF_FLAG[command["flag"]]
    elif header is not None and header["label"] in _LINE_OF_LABEL:
        version = _LINE_OF_LABEL[header["label"]]
    else:
        version = _line_that_takes(options_path, notes)
    options = llm_args.validate_yaml(options_path, version, "options")
    target = command.get("model")
    if target is None:
        model_yaml = repo / MODEL_YAML
        if not model_yaml.is_file():
            raise RepositoryError(
                f"{repo} names no target model: neither {COMMAND_FILE} (trtllm-serve's model argument) nor "
                f"{MODEL_YAML} (model:); rewrite the repository with `trt-spec repo --spec F --flavor llmapi`"
            )
        target = llm_args.validate_yaml(model_yaml, version, "model_yaml").model  # type: ignore[attr-defined]
    speculative = options.speculative_config
    k = speculative.max_draft_len
    if k > MAX_DRAFT_TOKENS:
        raise RepositoryError(
            f"{options_path}: speculative_config.max_draft_len {k}: the PyTorch twin drafts at most "
            f"{MAX_DRAFT_TOKENS} tokens per step"
        )
    ngram = isinstance(speculative, llm_args.NGramConfig)
    # NGram drafts carry no logits: TorchSampler verifies them by token match on every line, which
    # for a point-mass draft is exact (docs/llmapi.md).
    rejection = not ngram and (version == "1.2" or bool(getattr(speculative, "use_rejection_sampling", False)))
    label = llm_args.VERSION_LABELS[version]
    if options.dtype not in _SPEC_DTYPES:
        notes.append(f"dtype {options.dtype}: the twin runs the checkpoints in float32 on CPU whatever the dtype")
    remote = options.trust_remote_code
    name = header["name"] if header is not None else _SPEC_NAME.sub("-", repo.resolve().name).strip("-._")
    data: dict[str, Any] = {
        "name": name or LLMAPI_FLAVOR,
        "target": {"model": target, "tp_size": options.tensor_parallel_size, "trust_remote_code": remote},
        "speculative": SpeculativeSpec(
            num_draft_tokens=k, acceptance="probabilistic" if rejection else "greedy"
        ).model_dump(),
        "engine": {
            "dtype": options.dtype if options.dtype in _SPEC_DTYPES else _SPEC_DTYPES[0],
            "max_batch_size": options.max_batch_size,
            # The longest prompt: one context step of max_num_tokens (no chunked prefill is written), and
            # room for one generated token. Our choice for the twin; not read from upstream's scheduler.
            "max_input_len": min(options.max_num_tokens, options.max_seq_len - 1),
            "max_seq_len": options.max_seq_len,
        },
        "triton": {"flavor": "torch"},
    }
    if ngram:
        assert isinstance(speculative, llm_args.NGramConfig)
        # Prompt lookup with upstream's sizes: suffixes of max_matching_ngram_size down to 1 token.
        data["speculative"].update(
            method="prompt_lookup", prompt_lookup={"max_ngram": speculative.max_matching_ngram_size, "min_ngram": 1}
        )
        if speculative.is_public_pool or speculative.is_use_oldest:
            notes.append(
                "NGram with is_public_pool or is_use_oldest true: the twin matches each request against its own tokens "
                "and proposes the newest match (what trt-spec writes); upstream's pool would propose other drafts, "
                "the outputs are the same"
            )
    else:
        assert isinstance(speculative, llm_args.DraftTargetConfig)
        # The draft runs at the target's tp on this route (docs/llmapi.md).
        data["draft"] = {
            "model": speculative.speculative_model,
            "tp_size": options.tensor_parallel_size,
            "trust_remote_code": remote,
        }
    try:
        spec: Spec = parse_spec(data)  # relative checkpoint paths: against the current directory, as trtllm-serve
    except SpecError as exc:
        raise RepositoryError(f"{options_path}: the PyTorch twin cannot serve this route: {exc}") from None
    if ngram:
        how = "exact token match (NGram drafts carry no logits; exact for a point-mass draft)"
    elif rejection:
        how = "rejection sampling with the draft's logits" + (
            " (use_rejection_sampling: true)" if version == "1.3" else " (1.2.x two-model draft-target)"
        )
    else:
        how = "exact token match (use_rejection_sampling false or absent: 1.3+'s default)"
    notes.insert(
        0,
        f"llmapi route ({OPTIONS_FILE} for TensorRT-LLM {label}) served on the PyTorch twin: K {k} for every "
        f"request; greedy requests verified by exact match, sampled ones by {how}",
    )
    return TwinRoute(
        flavor=LLMAPI_FLAVOR,
        spec=spec,
        sampled_verification="rejection_sampling" if rejection else "token_match",
        server=f"trtllm-serve, TensorRT-LLM {label}",
        model_name=served_model_name(target),
        port=command.get("port") or PORT,
        iteration_stats=options.enable_iter_perf_stats,
        notes=tuple(notes),
    )


def served_model_name(model: str) -> str:
    """The model's name on trtllm-serve's /v1/models: the folder's name for a local checkpoint, else
    the string as given (a Hub id). Source: NVIDIA/TensorRT-LLM ``tensorrt_llm/serve/openai_server.py``
    @00057725d9a6591f033e44f31c219e2426827bb7, ``OpenAIServer.__init__`` (``model_dir.name`` when
    ``Path(model)`` is an existing directory)."""
    path = Path(model)
    return path.name if path.is_dir() else model


def _command(path: Path) -> dict[str, Any]:
    """From ``trtllm-serve.sh``: the model argument, the options flag and ``--port`` (absent ones absent)."""
    if not path.is_file():
        return {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if "trtllm-serve" not in words:
            continue
        found: dict[str, Any] = {}
        rest = words[words.index("trtllm-serve") + 1 :]
        while rest:
            word = rest.pop(0)
            if word in _LINE_OF_FLAG:
                found["flag"] = word
            elif word == "--port" and rest:
                value = rest.pop(0)
                found["port"] = int(value) if value.isdigit() else None
            elif word.startswith("--"):
                if rest and not rest[0].startswith("--") and word != "--trust_remote_code":
                    rest.pop(0)  # the option's value
            elif "model" not in found:
                found["model"] = word
        return found
    return {}


def _line_that_takes(options_path: Path, notes: list[str]) -> str:
    """The TensorRT-LLM line whose key table takes the file; both: upstream's current line (noted)."""
    try:
        data = yaml.safe_load(options_path.read_text())
    except yaml.YAMLError:
        data = None
    taking = []
    for line in llm_args.TRTLLM_VERSIONS:
        try:
            llm_args.validate_options(data, line, "options")
        except RepositoryError:
            continue
        taking.append(line)
    if not taking:
        return llm_args.DEFAULT_TRTLLM_VERSION  # validate_yaml then names the refused key
    if len(taking) > 1:
        notes.append(
            f"{options_path.name} does not say its TensorRT-LLM line (no {COMMAND_FILE} flag, no header): read as "
            f"{llm_args.VERSION_LABELS[llm_args.DEFAULT_TRTLLM_VERSION]}, whose keys it uses"
        )
        return llm_args.DEFAULT_TRTLLM_VERSION
    return taking[0]
