"""Prometheus text as Triton's metrics port serves it (its own per-model series and the loop
model's ``trt_spec_*`` counters), read in one place: supervision's hang check, the llmapi twin's
``/metrics`` and ``bench``'s loop breakdown."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

# One sample line: name, optional {labels}, value (Triton writes no timestamps); comments skipped.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$", re.M)
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>[^"]*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: str  # the text between the braces, "" without
    value: float

    @property
    def series(self) -> str:
        """The series as the text names it: ``name{labels}``, or the name alone."""
        return f"{self.name}{{{self.labels}}}" if self.labels else self.name

    def label(self, key: str) -> str | None:
        return next((m["value"] for m in _LABEL.finditer(self.labels) if m["key"] == key), None)


def samples(text: str) -> Iterator[Sample]:
    """Every sample of ``text`` with a numeric value."""
    for match in _SAMPLE.finditer(text):
        try:
            value = float(match["value"])
        except ValueError:
            continue
        yield Sample(match["name"], match["labels"] or "", value)


def scrape(url: str, timeout_s: float = 5.0) -> str:
    """The metrics endpoint's text.

    Raises:
        urllib.error.URLError, OSError: it cannot be read.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode()
