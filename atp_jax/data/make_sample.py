"""Rebuild the bundled WTQ sample (``wtq_sample.jsonl``) from the WTQ dev split.

The sample gives tests, examples and quick experiments a small, fixed set of questions
on tables small enough to attack on a CPU. Selection is deterministic:

1. Eligible: 4-12 data rows (enough rows for row order to matter), 2-6 columns, no line
   break in any cell, at least one gold answer, and at most 250 whitespace-separated
   tokens in the default Markdown rendering.
2. Order-free questions (those whose answer does not depend on the table's order, by
   :func:`atp_jax.data.order_filter.is_order_dependent`) fill the sample, so that an attack
   on it, which drops order-dependent questions, keeps nearly all of it; only
   ``order_dependent`` order-dependent questions are taken, and taken first so that the
   per-table limit cannot crowd them out: the order filter needs a few to drop in demos and
   tests. Each group is taken in the order of the SHA-256 of the question id (a fixed
   pseudo-random order that does not depend on the file's order).
3. At most ``max_per_table`` questions per table, so that no table dominates.
4. The chosen lines are written verbatim, in the order of the source file.

Run ``python -m atp_jax.data.make_sample --source <wtq dev.jsonl>`` to rebuild it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from atp_jax.data.datasets import DATA_ENV_VAR, example_from_dict
from atp_jax.data.order_filter import is_order_dependent
from atp_jax.tables.linearize import linearize

__all__ = ["SampleRule", "select_sample", "make_sample"]

_DEFAULT_OUT = Path(__file__).with_name("wtq_sample.jsonl")


@dataclass(frozen=True)
class SampleRule:
    """The selection rule; the defaults made the bundled file."""

    target: int = 180
    min_rows: int = 4
    max_rows: int = 12
    min_cols: int = 2
    max_cols: int = 6
    max_markdown_tokens: int = 250
    max_per_table: int = 3
    order_dependent: int = 12  # order-dependent questions kept after the order-free ones

    def __post_init__(self) -> None:
        if not 0 <= self.order_dependent <= self.target:
            raise ValueError(f"order_dependent={self.order_dependent} must be in [0, target={self.target}]")


def _eligible(record: dict, rule: SampleRule) -> bool:
    example = example_from_dict(record)
    table = example.table
    if not (rule.min_rows <= table.n_rows <= rule.max_rows):
        return False
    if not (rule.min_cols <= table.n_cols <= rule.max_cols):
        return False
    if not example.answers or any("\n" in cell for row in table.cells for cell in row):
        return False
    return len(linearize(table, "markdown").text.split()) <= rule.max_markdown_tokens


def _hash_key(record: dict) -> str:
    return hashlib.sha256(record["id"].encode("utf-8")).hexdigest()


def select_sample(lines: list[str], rule: SampleRule = SampleRule()) -> list[str]:
    """Choose sample lines from the WTQ dev JSONL lines; returns them in source order."""
    records = [json.loads(line) for line in lines]
    eligible = [k for k, record in enumerate(records) if _eligible(record, rule)]
    dependent = {k for k in eligible if is_order_dependent(example_from_dict(records[k]))}
    order_free = [k for k in eligible if k not in dependent]

    chosen: list[int] = []
    per_table: Counter[str] = Counter()
    groups = ((sorted(dependent), rule.order_dependent), (order_free, rule.target))
    for group, size_after in groups:
        for k in sorted(group, key=lambda k: _hash_key(records[k])):
            if len(chosen) == size_after:
                break
            table_id = records[k]["meta"]["table_id"]
            if per_table[table_id] < rule.max_per_table:
                per_table[table_id] += 1
                chosen.append(k)
    return [lines[k] for k in sorted(chosen)]


def make_sample(
    source: str | os.PathLike[str], out: str | os.PathLike[str] = _DEFAULT_OUT, rule: SampleRule = SampleRule()
) -> int:
    """Write the sample chosen from ``source`` (WTQ dev JSONL) to ``out``; return its size."""
    source = Path(source)
    if not source.is_file():
        raise FileNotFoundError(
            f"WTQ dev file not found: {source}; pass --source or set {DATA_ENV_VAR} to the "
            "directory that holds wtq/dev.jsonl"
        )
    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    chosen = select_sample(lines, rule)
    Path(out).write_text("".join(line + "\n" for line in chosen), encoding="utf-8")
    return len(chosen)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    data_dir = os.environ.get(DATA_ENV_VAR)
    default_source = Path(data_dir) / "wtq" / "dev.jsonl" if data_dir else None
    parser.add_argument(
        "--source", type=Path, default=default_source, help=f"WTQ dev JSONL (default: ${DATA_ENV_VAR}/wtq/dev.jsonl)"
    )
    parser.add_argument("--out", type=Path, default=_DEFAULT_OUT, help="output JSONL path")
    args = parser.parse_args(argv)
    if args.source is None:
        parser.error(f"pass --source or set {DATA_ENV_VAR}")
    count = make_sample(args.source, args.out)
    print(f"wrote {count} examples to {args.out}")


if __name__ == "__main__":
    main()
