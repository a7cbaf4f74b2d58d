"""Everything that can be wrong with a target/draft pair, found before any GPU time is spent.

:func:`check_pair` reads the two ``config.json`` files, the two tokenizers and the memory plan,
and returns one row per check: ``ok``, ``warn`` (works, but read this) or ``fatal`` (building
would fail, or speculation would silently be wrong). Problems become rows, never exceptions,
so one run shows all of them.

Supported for conversion and TensorRT-LLM 1.2.x engines: ``LlamaForCausalLM`` (Llama 1, 2,
3.x, Code Llama, TinyLlama and other Llama-architecture checkpoints) and ``MistralForCausalLM``
(which TensorRT-LLM builds as a Llama) without a sliding window shorter than the sequences.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from trt_spec.checkpoints.config import SUPPORTED_ARCHITECTURES, find_config_json, model_info_from_config
from trt_spec.checkpoints.download import local_snapshot
from trt_spec.errors import ModelConfigError, PlanError, TrtSpecError
from trt_spec.plan import Route, engine_route, make_plan
from trt_spec.plan.memory import format_bytes
from trt_spec.plan.tuning import TuningReport
from trt_spec.spec import Spec

OK, WARN, FATAL = "ok", "warn", "fatal"

# Rotary scalings TensorRT-LLM's Llama attention implements ("default" = none).
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")
SPECIAL_TOKENS = ("bos", "eos", "pad", "unk")
MAX_LISTED = 3  # differing entries shown per kind
DRAFT_SIZE_WARN_RATIO = 0.5  # above this, a draft step costs too much for speculation to pay


@dataclass(frozen=True)
class CheckRow:
    check: str
    status: str  # ok | warn | fatal
    detail: str


@dataclass(frozen=True)
class CheckReport:
    rows: tuple[CheckRow, ...]

    @property
    def ok(self) -> bool:
        """True when nothing is fatal."""
        return not self.fatal

    @property
    def fatal(self) -> tuple[CheckRow, ...]:
        return tuple(row for row in self.rows if row.status == FATAL)

    @property
    def warnings(self) -> tuple[CheckRow, ...]:
        return tuple(row for row in self.rows if row.status == WARN)

    def to_json(self) -> dict:
        return {"ok": self.ok, "rows": [row.__dict__ for row in self.rows]}


def check_pair(spec: Spec, tuning: TuningReport | None = None, route: Route | None = None) -> CheckReport:
    """Check ``spec``'s target and draft (where its method has one) against each other and against
    the spec, and the spec's K
    against a tuning report's recommendation when given (``trt-spec tune``). ``route``: what the
    spec's flavor says about its route (``Flavor.route``; default the engine route's).

    Raises nothing for a bad pair (that is what the fatal rows are for); only programming
    errors escape.
    """
    rows: list[CheckRow] = []
    configs = {}
    for role in spec.roles:
        row, config = _read_config(spec, role)
        rows.append(row)
        if config is not None:
            configs[role] = config
    tokenizers = _read_tokenizers(spec)
    pair = spec.draft is not None  # prompt lookup: the target alone, nothing to compare it with
    rows.append(_check_tokenizers(tokenizers) if pair else _check_own_tokenizer(tokenizers))
    if len(configs) == len(spec.roles):
        rows += [
            _check_architectures(spec, configs),
            _check_remote_code(spec, configs),
            *((_check_vocab(spec, configs, tokenizers), _check_sizes(configs)) if pair else ()),
            _check_positions(spec, configs),
            _check_tensor_parallel(spec, configs),
            _check_dtype(spec, configs),
        ]
    route = route or engine_route(spec)
    rows += _check_memory(spec, route)
    rows += _check_route(route)
    if tuning is not None:
        rows.append(_check_tuning(spec, tuning))
    return CheckReport(tuple(rows))


def _check_tuning(spec: Spec, tuning: TuningReport) -> CheckRow:
    warnings = tuning.warnings(spec)
    if warnings:
        return CheckRow("tuning", WARN, "; ".join(warnings))
    return CheckRow(
        "tuning",
        OK,
        f"{spec.speculative.method} at K = {spec.num_draft_tokens} is the tuning report's recommendation "
        f"(acceptance measured on {tuning.workload.source}, alpha {tuning.primary.alpha:.2f} at temperature "
        f"{tuning.primary.temperature:g}, {len(tuning.methods)} method(s) compared)",
    )


# -- the models ---------------------------------------------------------------------------------


def _read_config(spec: Spec, role: str) -> tuple[CheckRow, dict | None]:
    try:
        path, source = find_config_json(spec, role)
    except ModelConfigError as exc:
        return CheckRow(role, FATAL, str(exc)), None
    try:
        config = json.loads(path.read_text())
        info = model_info_from_config(config, source)
    except ModelConfigError as exc:
        return CheckRow(role, FATAL, str(exc)), None
    except json.JSONDecodeError as exc:
        return CheckRow(role, FATAL, f"{path} is not valid JSON: {exc}"), None
    except KeyError as exc:
        return CheckRow(role, FATAL, f"{path} lacks {exc.args[0]!r}; only Llama-style decoders are supported"), None
    detail = (
        f"{info.architecture}, {_count(info.num_params)} params, {info.num_layers} layers, "
        f"{info.num_heads} heads / {info.num_kv_heads} KV, vocab {info.vocab_size}; {source}"
    )
    return CheckRow(role, OK, detail), config


def _check_architectures(spec: Spec, configs: dict[str, dict]) -> CheckRow:
    problems = []
    for role, config in configs.items():
        architecture = (config.get("architectures") or ["(none)"])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            problems.append(f"{role} is {architecture}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
            continue
        if config.get("hidden_act", "silu") != "silu":
            problems.append(f"{role} uses hidden_act {config['hidden_act']!r}; Llama engines use silu")
        for key in ("attention_bias", "mlp_bias"):
            if config.get(key):
                problems.append(f"{role} has {key}: true, which the converter does not carry over")
        if config.get("quantization_config"):
            method = config["quantization_config"].get("quant_method", "?")
            problems.append(f"{role} is pre-quantized ({method}); use its float16/bfloat16 checkpoint")
        rope_type = _rope_type(config)
        if rope_type not in SUPPORTED_ROPE_TYPES:
            problems.append(f"{role} uses rope scaling {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        window = config.get("sliding_window")
        needed = _positions_needed(spec, role)
        if architecture == "MistralForCausalLM" and window is not None and window < needed:
            problems.append(
                f"{role} attends within a sliding window of {window} tokens but sequences reach {needed}; "
                f"lower engine.max_seq_len to {window - (needed - spec.engine.max_seq_len)} or less"
            )
    if problems:
        return CheckRow("architecture", FATAL, "; ".join(problems))
    names = {config["architectures"][0] for config in configs.values()}
    return CheckRow("architecture", OK, f"{' and '.join(sorted(names))}: convertible for TensorRT-LLM 1.2.x")


def _check_remote_code(spec: Spec, configs: dict[str, dict]) -> CheckRow:
    refused, allowed = [], []
    for role, config in configs.items():
        if not config.get("auto_map"):
            continue
        if spec.role(role).trust_remote_code:
            allowed.append(role)
        else:
            refused.append(role)
    if refused:
        return CheckRow(
            "remote code",
            FATAL,
            " and ".join(refused) + " ships its own modelling code (auto_map in config.json); review it, "
            "then set trust_remote_code: true for it in the spec to allow it",
        )
    if allowed:
        return CheckRow("remote code", WARN, " and ".join(allowed) + " will run code from its repo (trust_remote_code)")
    return CheckRow(
        "remote code", OK, "neither model ships its own code" if len(configs) > 1 else "the target ships no code"
    )


def _check_vocab(spec: Spec, configs: dict[str, dict], tokenizers: dict[str, dict]) -> CheckRow:
    rows = {role: config["vocab_size"] for role, config in configs.items()}
    ids = {role: _tokenizer_size(t) for role, t in tokenizers.items() if t and t.get("tokenizer_json")}
    for role in configs:
        if role in ids and rows[role] < ids[role]:
            return CheckRow(
                "vocabulary",
                FATAL,
                f"{role} has {rows[role]} embedding rows but its tokenizer uses ids up to {ids[role] - 1}",
            )
    covered = f"the tokenizer uses {ids['target']} ids" if "target" in ids else "tokenizer size unknown"
    if rows["target"] == rows["draft"]:
        return CheckRow("vocabulary", OK, f"both have {rows['target']} embedding rows; {covered}")
    sizes = f"target has {rows['target']} embedding rows, draft {rows['draft']}"
    if spec.speculative.acceptance == "probabilistic":
        return CheckRow(
            "vocabulary",
            FATAL,
            f"{sizes}: probabilistic acceptance compares the two distributions row by row, so they must be "
            "equal; use speculative.acceptance: greedy or a pair with equal vocab sizes",
        )
    return CheckRow(
        "vocabulary",
        WARN,
        f"{sizes}; both cover the shared tokenizer ({covered}), so greedy acceptance compares the same token ids "
        "(the extra rows are padding no text encodes to)",
    )


def _check_sizes(configs: dict[str, dict]) -> CheckRow:
    params = {role: model_info_from_config(config, role).num_params for role, config in configs.items()}
    ratio = params["draft"] / params["target"]
    detail = f"draft {_count(params['draft'])} params is {ratio:.1%} of target {_count(params['target'])}"
    if ratio >= 1:
        return CheckRow("sizes", FATAL, f"{detail}: the draft must be smaller than the target (swapped models?)")
    if ratio > DRAFT_SIZE_WARN_RATIO:
        return CheckRow("sizes", WARN, f"{detail}: a draft this large rarely makes decoding faster")
    return CheckRow("sizes", OK, detail)


def _check_positions(spec: Spec, configs: dict[str, dict]) -> CheckRow:
    problems, supported = [], []
    for role, config in configs.items():
        positions = config.get("max_position_embeddings", 0)
        needed = _positions_needed(spec, role)
        supported.append(f"{role} {positions} (needs {needed})")
        if positions < needed:
            problems.append(f"{role} supports {positions} positions but needs {needed}")
    if problems:
        return CheckRow(
            "positions",
            FATAL,
            "; ".join(problems) + " (engine.max_seq_len, plus K for the target's drafted tokens); "
            "lower engine.max_seq_len",
        )
    return CheckRow("positions", OK, ", ".join(supported))


def _check_tensor_parallel(spec: Spec, configs: dict[str, dict]) -> CheckRow:
    problems, summary = [], []
    for role, config in configs.items():
        tp = spec.role(role).tp_size
        info = model_info_from_config(config, role)
        if info.num_heads % tp:
            problems.append(f"{role}: {info.num_heads} attention heads do not split over tp_size {tp}")
        if info.num_kv_heads % tp and tp % info.num_kv_heads:
            problems.append(f"{role}: {info.num_kv_heads} KV heads neither split over nor replicate to tp_size {tp}")
        if info.intermediate_size % tp:
            problems.append(f"{role}: intermediate_size {info.intermediate_size} does not split over tp_size {tp}")
        summary.append(f"{role} tp {tp}")
    if problems:
        return CheckRow("tensor parallel", FATAL, "; ".join(problems) + "; choose another tp_size")
    return CheckRow("tensor parallel", OK, ", ".join(summary) + ": heads and MLP split evenly")


def _check_dtype(spec: Spec, configs: dict[str, dict]) -> CheckRow:
    engine_dtype = spec.engine.dtype
    cast = []
    for role, config in configs.items():
        source = config.get("torch_dtype") or config.get("dtype") or "float32"
        if source == "bfloat16" and engine_dtype == "float16":
            return CheckRow(
                "dtype",
                WARN,
                f"{role} weights are bfloat16 and engine.dtype is float16: values beyond +-65504 would overflow "
                "(rare in Llama weights, but activations can); engine.dtype: bfloat16 avoids the question",
            )
        if source != engine_dtype:
            cast.append(f"{role} {source}")
    if cast:
        return CheckRow("dtype", OK, f"{', '.join(cast)} weights are converted to {engine_dtype}")
    return CheckRow("dtype", OK, f"{'both ' if len(configs) > 1 else ''}stored as {engine_dtype}, as the engines run")


def _check_memory(spec: Spec, route: Route) -> list[CheckRow]:
    try:
        plan = make_plan(spec, route=route)
    except (PlanError, ModelConfigError) as exc:
        return [CheckRow("memory", FATAL, str(exc))]
    memory = plan.memory
    gpu0 = memory.gpus[0]
    detail = (
        f"{spec.target.tp_size} x {memory.gpu.upper()}: GPU 0 holds target {format_bytes(gpu0.target_fixed)}"
        + (f" + draft {format_bytes(gpu0.draft_fixed)}" if memory.draft else " (no draft engine)")
        + " (weights, activations, runtime) and KV cache for "
        f"{memory.kv_tokens} tokens ({memory.full_sequences} sequences of max_seq_len + K)"
    )
    rows = [CheckRow("memory", OK, detail)]
    return rows + [CheckRow("memory", WARN, warning) for warning in plan.warnings if warning not in route.warnings]


def _check_route(route: Route) -> list[CheckRow]:
    """The route's own warnings and notes (the engine route's: the engines' input length), in rows
    named after it."""

    def row(status: str, text: str) -> CheckRow:  # the row's name already says the route
        return CheckRow(route.label, status, text.removeprefix(f"{route.label}: ").removeprefix(f"{route.label}, "))

    return [row(WARN, w) for w in route.warnings] + [row(OK, n) for n in route.notes]


def _positions_needed(spec: Spec, role: str) -> int:
    # The target also holds the K drafted tokens it verifies (the builder adds max_draft_len).
    return spec.engine.max_seq_len + (spec.num_draft_tokens if role == "target" else 0)


def _rope_type(config: dict) -> str:
    # transformers < 5 writes rope_scaling (null for plain RoPE); 5.x writes rope_parameters.
    scaling = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"


def _count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.2f}M"


# -- the tokenizers -----------------------------------------------------------------------------


def _read_tokenizers(spec: Spec) -> dict[str, dict]:
    """Per role: the parsed tokenizer files, or an ``error`` entry saying why they are unavailable."""
    tokenizers: dict[str, dict] = {}
    for role in spec.roles:
        try:
            path = local_snapshot(spec, role).path
        except TrtSpecError as exc:
            tokenizers[role] = {"error": str(exc)}
            continue
        tokenizers[role] = {
            "path": path,
            "tokenizer_json": _load_json(path / "tokenizer.json"),
            "tokenizer_config": _load_json(path / "tokenizer_config.json") or {},
            "config": _load_json(path / "config.json") or {},
            "sentencepiece_sha256": _sha256(path / "tokenizer.model"),
        }
    return tokenizers


def _check_own_tokenizer(tokenizers: dict[str, dict]) -> CheckRow:
    """A spec without a draft model (prompt lookup): the target's tokenizer is there; nothing to compare."""
    target = tokenizers["target"]
    if "error" in target:
        return CheckRow("tokenizer", FATAL, target["error"])
    found = "tokenizer.json" if target["tokenizer_json"] is not None else "sentencepiece tokenizer.model"
    return CheckRow("tokenizer", OK, f"the target's {found}; no draft model to compare it with (prompt lookup)")


def _check_tokenizers(tokenizers: dict[str, dict]) -> CheckRow:
    errors = [t["error"] for t in tokenizers.values() if "error" in t]
    if errors:
        return CheckRow("tokenizer", FATAL, "; ".join(errors))
    target, draft = tokenizers["target"], tokenizers["draft"]
    if target["tokenizer_json"] is None or draft["tokenizer_json"] is None:
        return _compare_sentencepiece(target, draft)
    differences = tokenizer_differences(target, draft)
    if differences:
        shown = "; ".join(differences[: 2 * MAX_LISTED])
        more = len(differences) - 2 * MAX_LISTED
        return CheckRow(
            "tokenizer", FATAL, f"the tokenizers differ: {shown}" + (f" (+{more} more)" if more > 0 else "")
        )
    model = target["tokenizer_json"]["model"]
    specials = _special_token_ids(target)
    special_text = ", ".join(f"{name} {token_id}" for name, token_id in specials.items() if token_id is not None)
    merges = f", {len(model['merges'])} merges" if "merges" in model else ""
    return CheckRow(
        "tokenizer",
        OK,
        f"identical: {_tokenizer_size(target)} ids ({model.get('type', '?')}{merges}); special ids {special_text or 'none'}",
    )


def tokenizer_differences(target: dict, draft: dict) -> list[str]:
    """The first differing entries of two parsed tokenizers, as short sentences (empty: identical)."""
    a, b = target["tokenizer_json"], draft["tokenizer_json"]
    differences = []
    if a["model"].get("type") != b["model"].get("type"):
        differences.append(f"model type {a['model'].get('type')} vs {b['model'].get('type')}")
    differences += _vocab_differences(a["model"].get("vocab"), b["model"].get("vocab"))
    differences += _merge_differences(a["model"].get("merges"), b["model"].get("merges"))
    other_model_keys = sorted((set(a["model"]) | set(b["model"])) - {"type", "vocab", "merges"})
    for key in other_model_keys:
        if a["model"].get(key) != b["model"].get(key):
            differences.append(f"model.{key} {a['model'].get(key)!r} vs {b['model'].get(key)!r}")
    for component in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if a.get(component) != b.get(component):
            differences.append(f"{component} differs ({_kind(a.get(component))} vs {_kind(b.get(component))})")
    differences += _added_token_differences(a.get("added_tokens") or [], b.get("added_tokens") or [])
    target_specials, draft_specials = _special_token_ids(target), _special_token_ids(draft)
    for name in SPECIAL_TOKENS:
        if target_specials[name] != draft_specials[name]:
            differences.append(f"{name} token id {target_specials[name]} in target, {draft_specials[name]} in draft")
    return differences


def _vocab_differences(a, b) -> list[str]:
    if isinstance(a, list) or isinstance(b, list):  # Unigram: [[piece, score], ...], the index is the id
        a_pieces = [entry[0] for entry in a or []]
        b_pieces = [entry[0] for entry in b or []]
        found = [
            f"id {i} is {x!r} in target, {y!r} in draft" for i, (x, y) in enumerate(zip(a_pieces, b_pieces)) if x != y
        ][:MAX_LISTED]
        if len(a_pieces) != len(b_pieces):
            found.append(f"{len(a_pieces)} pieces in target, {len(b_pieces)} in draft")
        return found
    a, b = a or {}, b or {}
    found = []
    for token in sorted(set(a) | set(b), key=lambda t: (a.get(t, b.get(t)), t)):
        if a.get(token) == b.get(token):
            continue
        if token not in b:
            found.append(f"{token!r} (id {a[token]}) only in target")
        elif token not in a:
            found.append(f"{token!r} (id {b[token]}) only in draft")
        else:
            found.append(f"{token!r} is id {a[token]} in target, {b[token]} in draft")
        if len(found) == MAX_LISTED:
            break
    return found


def _merge_differences(a, b) -> list[str]:
    a, b = [_merge_text(m) for m in a or []], [_merge_text(m) for m in b or []]
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return [f"merge #{index} is {x!r} in target, {y!r} in draft"]
    if len(a) != len(b):
        return [f"{len(a)} merges in target, {len(b)} in draft"]
    return []


def _added_token_differences(a: list[dict], b: list[dict]) -> list[str]:
    def describe(token: dict | None) -> str:
        if token is None:
            return "nothing"
        return repr(token["content"]) + (" (special)" if token.get("special") else "")

    def same(x: dict | None, y: dict | None) -> bool:
        fields = ("content", "special")
        return x is not None and y is not None and all(x.get(f) == y.get(f) for f in fields)

    a_by_id, b_by_id = {t["id"]: t for t in a}, {t["id"]: t for t in b}
    found = []
    for token_id in sorted(set(a_by_id) | set(b_by_id)):
        x, y = a_by_id.get(token_id), b_by_id.get(token_id)
        if not same(x, y):
            found.append(f"added token id {token_id} is {describe(x)} in target, {describe(y)} in draft")
        if len(found) == MAX_LISTED:
            break
    return found


def _compare_sentencepiece(target: dict, draft: dict) -> CheckRow:
    both_sentencepiece_only = target["tokenizer_json"] is None and draft["tokenizer_json"] is None
    digest = target["sentencepiece_sha256"]
    if both_sentencepiece_only and digest is not None and digest == draft["sentencepiece_sha256"]:
        return CheckRow("tokenizer", OK, "identical tokenizer.model files (sentencepiece)")
    return CheckRow(
        "tokenizer",
        FATAL,
        f"cannot compare entry by entry: {target['path']} and {draft['path']} do not both have tokenizer.json "
        "(and their tokenizer.model files are not identical); save both tokenizers with a fast tokenizer",
    )


def _special_token_ids(tokenizer: dict) -> dict[str, int | list[int] | None]:
    """bos/eos/pad/unk ids: the tokenizer's own tokens looked up in its vocabulary, else config.json's ids."""
    vocab = _token_to_id(tokenizer["tokenizer_json"])
    found = {}
    for name in SPECIAL_TOKENS:
        token = tokenizer["tokenizer_config"].get(f"{name}_token")
        content = token.get("content") if isinstance(token, dict) else token
        found[name] = vocab.get(content) if content is not None else tokenizer["config"].get(f"{name}_token_id")
    return found


def _tokenizer_size(tokenizer: dict) -> int:
    """One more than the largest id the tokenizer can produce."""
    ids = list(_token_to_id(tokenizer["tokenizer_json"]).values())
    return max(ids) + 1 if ids else 0


def _token_to_id(tokenizer_json: dict) -> dict[str, int]:
    vocab = tokenizer_json["model"].get("vocab") or {}
    mapping = {entry[0]: i for i, entry in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)
    mapping.update({t["content"]: t["id"] for t in tokenizer_json.get("added_tokens") or []})
    return mapping


def _merge_text(merge) -> str:
    return " ".join(merge) if isinstance(merge, list) else merge


def _kind(component) -> str:
    return component.get("type", "?") if isinstance(component, dict) else repr(component)


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
