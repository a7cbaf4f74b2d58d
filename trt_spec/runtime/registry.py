"""Registries found by discovery: every module of a package that defines one named attribute of one
type is an entry, keyed by the entry's ``name`` (speculation methods, ``runtime/methods/``; flavors,
``repository/flavors/``). Adding an entry is adding a module; nothing lists them by hand.

Standard library only: loaded inside Triton's python-backend stub.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


Entry = TypeVar("Entry", bound=Named)


def discover(package: str, path: Iterable[str], attribute: str, kind: type[Entry]) -> dict[str, Entry]:
    """``{entry.name: entry}``, sorted by name, for each module of ``package`` (its ``__path__``:
    ``path``) whose ``attribute`` is a ``kind``."""
    found: dict[str, Entry] = {}
    for module in pkgutil.iter_modules(path):
        entry = getattr(importlib.import_module(f"{package}.{module.name}"), attribute, None)
        if isinstance(entry, kind):
            found[entry.name] = entry
    return dict(sorted(found.items()))
