"""Benchmark prompts from the user's own data instead of the packaged ones.

A source is a local file (``.jsonl``, ``.json``, ``.csv``, ``.parquet``) or a Hugging Face dataset
name, read with the ``datasets`` library either way (only local files can be tested here; no hub is
reachable). Each record gives one prompt, from the first of these it has (or ``column``):

- ``messages``: OpenAI chat messages (``[{"role": ..., "content": ...}]``), rendered with the target
  tokenizer's chat template, as the server's ``/v1/chat/completions`` renders them; the messages up
  to the first assistant turn are the prompt, that turn's length is the reference output length;
- ``conversations``: ShareGPT-style turns (``[{"from": "human" | "gpt" | "system", "value": ...}]``),
  mapped to chat messages and rendered the same way;
- ``prompt``, ``text``, ``input``, ``question`` or ``instruction``: plain text; a ``completion``,
  ``output``, ``response`` or ``answer`` field is the reference output.

A seeded sample of ``num_prompts`` is drawn; a prompt over the spec's limits (``max_input_len``
tokens, or no room for a single new token within ``max_seq_len``) is left out and counted. The
workload reports the distribution of prompt and reference output lengths in tokens.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLAIN_COLUMNS = ("prompt", "text", "input", "question", "instruction")
OUTPUT_COLUMNS = ("completion", "output", "response", "answer")
CHAT_COLUMN = "messages"
SHAREGPT_COLUMN = "conversations"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
DEFAULT_SEED = 0


class DatasetError(ValueError):
    """A dataset that cannot give prompts; the message names the source, the record or column, and the fix."""


@dataclass(frozen=True)
class DatasetPrompt:
    text: str  # what is sent (chat rendered with the template)
    tokens: list[int]  # the target tokenizer's ids of ``text`` (special tokens as preprocessing adds them)
    reference_output_tokens: int | None  # the dataset's own answer's length, when it has one


@dataclass(frozen=True)
class LengthSummary:
    count: int
    min: int
    median: float
    p90: float
    max: int

    @classmethod
    def of(cls, lengths: Sequence[int]) -> LengthSummary | None:
        if not lengths:
            return None
        ordered = sorted(lengths)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        return cls(len(ordered), ordered[0], statistics.median(ordered), p90, ordered[-1])

    def to_json(self) -> dict[str, float]:
        return {"count": self.count, "min": self.min, "median": self.median, "p90": self.p90, "max": self.max}


@dataclass(frozen=True)
class Workload:
    """The prompts of one source, and what was left out."""

    source: str
    kind: str  # "chat", "sharegpt" or "plain"
    prompts: list[DatasetPrompt]
    records: int  # in the source (split)
    too_long: int  # sampled but over the spec's limits
    seed: int
    notes: list[str] = field(default_factory=list)

    @property
    def prompt_lengths(self) -> LengthSummary | None:
        return LengthSummary.of([len(prompt.tokens) for prompt in self.prompts])

    @property
    def output_lengths(self) -> LengthSummary | None:
        return LengthSummary.of(
            [p.reference_output_tokens for p in self.prompts if p.reference_output_tokens is not None]
        )

    def to_json(self) -> dict[str, Any]:
        prompts, outputs = self.prompt_lengths, self.output_lengths
        return {
            "source": self.source,
            "kind": self.kind,
            "records": self.records,
            "prompts": len(self.prompts),
            "too_long": self.too_long,
            "seed": self.seed,
            "prompt_tokens": prompts.to_json() if prompts else None,
            "reference_output_tokens": outputs.to_json() if outputs else None,
        }

    def describe(self) -> str:
        prompts, outputs = self.prompt_lengths, self.output_lengths
        line = f"{len(self.prompts)} prompts from {self.source} ({self.kind}, {self.records} records, seed {self.seed})"
        if self.too_long:
            line += f"; {self.too_long} sampled prompts over the spec's limits left out"
        if prompts:
            line += (
                f"; prompt tokens min {prompts.min}, median {prompts.median:g}, p90 {prompts.p90}, max {prompts.max}"
            )
        if outputs:
            line += f"; reference outputs median {outputs.median:g} tokens (p90 {outputs.p90})"
        return line


def read_records(source: str, *, split: str = "train") -> list[Mapping[str, Any]]:
    """The records of a local file or a Hugging Face dataset (name, or name:config), as dicts.

    Raises:
        DatasetError: an unknown file type, a file or dataset that cannot be read.
    """
    try:
        import datasets
    except ImportError:
        raise DatasetError("--dataset needs the datasets library: pip install 'trt-spec[bench]'") from None

    path = Path(source)
    try:
        if path.exists():
            kind = FILE_FORMATS.get(path.suffix.lower())
            if kind is None:
                raise DatasetError(
                    f"{source}: a {path.suffix or 'suffix-less'} file; give a .jsonl, .json, .csv or .parquet file"
                )
            data = datasets.load_dataset(kind, data_files=str(path), split="train")
        else:
            name, _, config = source.partition(":")
            data = datasets.load_dataset(name, config or None, split=split)
    except DatasetError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; one line naming the source
        raise DatasetError(f"cannot read {source}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return [dict(record) for record in data]


def _chat_prompt(messages: Any, where: str) -> tuple[list[dict[str, str]], str | None]:
    """The messages before the first assistant turn, and that turn's content."""
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: messages must be a non-empty list of {{role, content}}")
    prompt: list[dict[str, str]] = []
    for message in messages:
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise DatasetError(f"{where}: each message needs a role and a content; got {message!r:.80}")
        if message["role"] == "assistant" and prompt:
            return prompt, str(message["content"])
        prompt.append({"role": str(message["role"]), "content": str(message["content"])})
    return prompt, None


def _sharegpt_messages(turns: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(turns, list):
        raise DatasetError(f"{where}: conversations must be a list of {{from, value}}")
    messages = []
    for turn in turns:
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, Mapping) else None
        if role is None:
            raise DatasetError(f"{where}: a turn's from must be one of {', '.join(SHAREGPT_ROLES)}; got {turn!r:.80}")
        messages.append({"role": role, "content": str(turn.get("value", ""))})
    return messages


def _kind(record: Mapping[str, Any], column: str | None, source: str) -> tuple[str, str]:
    """(kind, column) of the records, from ``column`` or the first known column present."""
    if column is not None:
        if column not in record:
            raise DatasetError(f"{source}: no column {column!r}; its columns: {', '.join(map(str, record))}")
        kind = "chat" if column == CHAT_COLUMN else "sharegpt" if column == SHAREGPT_COLUMN else "plain"
        return kind, column
    for kind, name in (("chat", CHAT_COLUMN), ("sharegpt", SHAREGPT_COLUMN)):
        if name in record:
            return kind, name
    for name in PLAIN_COLUMNS:
        if name in record:
            return "plain", name
    raise DatasetError(
        f"{source}: no prompt column among {', '.join((CHAT_COLUMN, SHAREGPT_COLUMN, *PLAIN_COLUMNS))}; "
        f"its columns: {', '.join(map(str, record))}; name one with --dataset-column"
    )


def load_workload(
    source: str,
    tokenizer: Any,
    *,
    num_prompts: int,
    max_input_len: int,
    max_seq_len: int,
    column: str | None = None,
    split: str = "train",
    seed: int = DEFAULT_SEED,
) -> Workload:
    """A seeded sample of ``num_prompts`` prompts from ``source`` (see the module docstring).

    Raises:
        DatasetError: the source cannot be read, has no prompt column, a record is malformed, or no
            sampled prompt fits the spec's limits.
    """
    from trt_spec.serving.openai_backend import render_chat

    records = read_records(source, split=split)
    if not records:
        raise DatasetError(f"{source}: no records")
    kind, name = _kind(records[0], column, source)
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    prompts: list[DatasetPrompt] = []
    too_long = 0
    for index in order:
        if len(prompts) == num_prompts:
            break
        record, where = records[index], f"{source}, record {index}"
        reference: str | None = None
        if kind == "plain":
            text = record.get(name)
            if not isinstance(text, str) or not text:
                raise DatasetError(f"{where}: {name} must be a non-empty string; got {text!r:.80}")
            reference = next((str(record[c]) for c in OUTPUT_COLUMNS if record.get(c)), None)
        else:
            messages = record.get(name)
            if kind == "sharegpt":
                messages = _sharegpt_messages(messages, where)
            chat, reference = _chat_prompt(messages, where)
            try:
                text = render_chat(tokenizer, chat, add_special_tokens=True)
            except Exception as exc:  # noqa: BLE001 - the server's own 400 (no template, a failing template)
                raise DatasetError(f"{where}: {getattr(exc, 'message', exc)}") from None
        tokens = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not tokens or len(tokens) > max_input_len or len(tokens) >= max_seq_len:
            too_long += 1
            continue
        out = None if reference is None else len(tokenizer(reference, add_special_tokens=False)["input_ids"])
        prompts.append(DatasetPrompt(text, tokens, out))
    if not prompts:
        raise DatasetError(
            f"{source}: none of the {too_long} sampled prompts fits the spec's limits (max_input_len "
            f"{max_input_len}, max_seq_len {max_seq_len} tokens)"
        )
    return Workload(source, kind, prompts, len(records), too_long, seed)
