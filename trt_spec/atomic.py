"""Writing files and directories so that a reader never sees half of one.

Everything is written to a hidden temporary sibling and renamed into place; leftovers of a
process that was killed mid-write are removed the next time the same path is written.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temp.write_text(text)
    temp.replace(path)
    return path


def write_json(path: str | Path, data: object) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextmanager
def staged_dir(final: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``final``; on a clean exit it replaces ``final``.

    On an exception (or Ctrl-C) the sibling is removed and ``final`` is left as it was. The old
    ``final`` is removed only after the new one is in place.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for pattern in (f".{final.name}.partial-*", f".{final.name}.retired-*"):
        for leftover in final.parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)
    partial = final.with_name(f".{final.name}.partial-{os.getpid()}")
    partial.mkdir()
    try:
        yield partial
        retired = final.with_name(f".{final.name}.retired-{os.getpid()}")
        if final.exists():
            final.rename(retired)
        partial.rename(final)
        shutil.rmtree(retired, ignore_errors=True)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
