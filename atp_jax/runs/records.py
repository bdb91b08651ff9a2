"""Result records: appended atomically to ``results.jsonl``, read back for resuming and reports.

One JSON object per (example id, attack), appended through ``atp_jax.jsonl``: a killed run leaves either the
whole line or nothing, and a torn last line is skipped when reading and cut off before the next append.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from atp_jax import jsonl


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
    """An example an attack could not take, with the reason: recorded so that a resume does not retry it.

    ``retry``: the cause was passing (a victim server down or timing out), not the example: a resume runs the pair
    again, and the record it then writes supersedes this one (``done_keys``, ``folders.merge_records``).
    """

    id: str
    attack: str
    skipped: str
    transferred_from: dict[str, Any] | None = None
    retry: bool = False

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if self.transferred_from is None:
            del out["transferred_from"]
        if not self.retry:
            del out["retry"]
        return out


def append_record(path: str | os.PathLike, record: dict | AttackRecord | SkipRecord) -> None:
    """Appends ``record`` as one JSON line (keys sorted), cutting off a torn last line first."""
    jsonl.append(path, record.as_dict() if isinstance(record, (AttackRecord, SkipRecord)) else record)


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Every complete record of a results file (a torn final line is ignored).

    Raises ``ValueError`` naming the file and line when a complete line is not a JSON object (a damaged or foreign
    file; deleting the line reruns that pair on resume) or is a record without its keys.
    """
    for number, record in jsonl.read(path):
        missing = [key for key in ("id", "attack") if not isinstance(record.get(key), str)]
        if missing:
            raise ValueError(
                f"{path}:{number} is a record without {' and '.join(missing)} (a string each: "
                "results are keyed by them); delete that line or restore the file"
            )
        yield record


def done_keys(paths) -> set[tuple[str, str]]:
    """(example id, attack) pairs already recorded in any of ``paths`` (a skip marked ``retry`` is not done)."""
    return {(r["id"], r["attack"]) for p in paths for r in read_records(p) if not r.get("retry")}
