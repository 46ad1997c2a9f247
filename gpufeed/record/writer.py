"""Append-only JSON-lines files, written in whole lines so a crash leaves at most one torn line."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable


def _default(value: Any) -> Any:
    # numpy scalars and paths sneak into records; everything else is a bug worth seeing.
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_default)


class JsonlWriter:
    """One JSON object per line, appended with plain ``write`` system calls.

    Unbuffered on purpose: the probe's writer lives in processes that fork DataLoader workers,
    and a buffered file object's internal lock, held by a flushing thread at the moment of a fork,
    would stay locked forever in the child.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab", buffering=0)

    def write_many(self, objs: Iterable[Any]) -> None:
        data = "".join(dumps(o) + "\n" for o in objs).encode("utf-8")
        view = memoryview(data)
        while view and not self._file.closed:
            written = self._file.write(view)
            view = view[written or 0:]

    def write(self, obj: Any) -> None:
        self.write_many((obj,))

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Replace ``path`` in one rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_default) + "\n", encoding="utf-8")
    os.replace(tmp, path)
