"""Result records: appended atomically to ``results.jsonl``, read back for resuming and reports.

One JSON object per (example id, attack). Each record is written with a single ``os.write`` of one
line on an ``O_APPEND`` descriptor and fsynced, so a killed run leaves either the whole line or
nothing; a torn last line (power loss mid-write) is skipped when reading, and cut off before the next
append, so that a resumed run does not glue its first record onto the fragment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_TAIL_BLOCK = 1 << 16  # bytes read per step when looking back for the last complete line


@dataclasses.dataclass(frozen=True)
class AttackRecord:
    """One attack's result on one example, as written to ``results.jsonl`` (``as_dict``).

    ``row_perm``/``col_perm``: the chosen order (data rows and columns, in the original's indices);
    ``answer_loss``/``clean_loss``: reference-answer loss under it / under the original order, on
    re-rendered text; ``queries``/``backward_calls``: sequences the attack forwarded / backpropagated;
    ``seconds``: the attack's time; ``prediction``/``scores``: the model's answer under the order and
    its metrics (None / {} without generation); ``trace``: the method's own diagnostics. Optional parts
    appear only when set: ``defended`` (the smoothing defense's answers) with ``defense_seconds``, and
    ``transferred_from`` (where a replayed order came from), ``compiles`` (the XLA programs the record cost
    and the seconds spent tracing, lowering and compiling them: ``atp_jax.compilation``; a timing field).
    """

    id: str
    attack: str
    row_perm: list[int]
    col_perm: list[int]
    answer_loss: float
    clean_loss: float
    queries: int
    backward_calls: int
    seconds: float
    prediction: str | None = None
    scores: dict[str, Any] = dataclasses.field(default_factory=dict)
    generate_seconds: float = 0.0
    trace: dict[str, Any] = dataclasses.field(default_factory=dict)
    defended: dict[str, Any] | None = None
    defense_seconds: float | None = None
    transferred_from: dict[str, Any] | None = None
    compiles: dict[str, Any] | None = None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        for optional in ("defended", "defense_seconds", "transferred_from", "compiles"):
            if out[optional] is None:
                del out[optional]
        out["row_perm"], out["col_perm"] = [int(i) for i in self.row_perm], [int(i) for i in self.col_perm]
        return out


@dataclasses.dataclass(frozen=True)
class SkipRecord:
    """An example an attack could not take, with the reason: recorded so that a resume does not retry it."""

    id: str
    attack: str
    skipped: str
    transferred_from: dict[str, Any] | None = None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.transferred_from is None:
            del out["transferred_from"]
        return out


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


def append_record(path: str | os.PathLike, record: dict | AttackRecord | SkipRecord) -> None:
    """Appends ``record`` as one JSON line (keys sorted), cutting off a torn last line first."""
    if isinstance(record, (AttackRecord, SkipRecord)):
        record = record.as_dict()
    line = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.ftruncate(fd, _complete_length(fd))  # one writer per file: nobody else is mid-line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Every complete record of a results file (a torn final line is ignored).

    Raises ``ValueError`` naming the file and line when a complete line is not a JSON object: that is
    not a torn write but a damaged or foreign file.
    """
    path = Path(path)
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # torn last line: the run was killed mid-write
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{number} is not a JSON record ({e.msg}); delete that line (the pair is then "
                    "rerun on resume) or restore the file"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}:{number} holds a JSON {type(record).__name__}, not a record object; "
                    "delete that line or restore the file"
                )
            missing = [key for key in ("id", "attack") if not isinstance(record.get(key), str)]
            if missing:
                raise ValueError(
                    f"{path}:{number} is a record without {' and '.join(missing)} (a string each: "
                    "results are keyed by them); delete that line or restore the file"
                )
            yield record


def done_keys(paths) -> set[tuple[str, str]]:
    """(example id, attack) pairs already recorded in any of ``paths``."""
    return {(r["id"], r["attack"]) for p in paths for r in read_records(p)}
