"""Append-only JSON-lines files that survive a killed writer: one ``os.write`` per line, torn tails ignored.

Each object is written with a single ``os.write`` of one line on an ``O_APPEND`` descriptor and fsynced, so a
killed process leaves either the whole line or nothing; a torn last line (power loss mid-write) is skipped when
reading, and cut off before the next append, so that the next line is not glued onto the fragment. One writer
per file (``append`` serialises the threads of one process).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

_TAIL_BLOCK = 1 << 16  # bytes read per step when looking back for the last complete line
_APPEND_LOCK = threading.Lock()


def _complete_length(fd: int) -> int:
    """Length of the file up to and including its last newline (0 when it has none)."""
    end = os.fstat(fd).st_size
    pos = end
    while pos > 0:
        start = max(0, pos - _TAIL_BLOCK)
        block = os.pread(fd, pos - start, start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0


def append(path: str | os.PathLike, obj: dict) -> None:
    """Appends ``obj`` as one JSON line (keys sorted), cutting off a torn last line first."""
    line = (json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n").encode()
    with _APPEND_LOCK:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.ftruncate(fd, _complete_length(fd))  # one writer per file: nobody else is mid-line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def read(path: str | os.PathLike, what: str = "JSON record") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every complete line of ``path`` (none when it does not exist; a torn final
    line is ignored).

    Raises ``ValueError`` naming the file and line when a complete line is not a JSON object (``what`` names what
    the line should hold): that is not a torn write but a damaged or foreign file.
    """
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # torn last line: the writer was killed mid-write
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{number} is not a {what} ({e.msg}); delete that line or restore the file"
                ) from None
            if not isinstance(obj, dict):
                raise ValueError(
                    f"{path}:{number} holds a JSON {type(obj).__name__}, not a {what} object; "
                    "delete that line or restore the file"
                )
            yield number, obj
