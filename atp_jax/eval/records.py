"""Result records: appended atomically to ``results.jsonl``, read back for resuming and reports.

One JSON object per (example id, attack). Each record is written with a single ``os.write`` of one
line on an ``O_APPEND`` descriptor and fsynced, so a killed run leaves either the whole line or
nothing; a torn last line (power loss mid-write) is skipped when reading.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path


def append_record(path: str | os.PathLike, record: dict) -> None:
    line = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Every complete record of a results file (a torn final line is ignored)."""
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # torn last line: the run was killed mid-write
            line = line.strip()
            if line:
                yield json.loads(line)


def done_keys(paths) -> set[tuple[str, str]]:
    """(example id, attack) pairs already recorded in any of ``paths``."""
    return {(r["id"], r["attack"]) for p in paths for r in read_records(p)}
