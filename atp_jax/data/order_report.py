"""How well the order classifier agrees with the hand labels, and what each order rule drops.

The hand labels (``order_labels_wtq_dev.jsonl``, bundled with the package) mark WTQ dev
questions flagged by the keyword rule as order-dependent or not, each with a one-line reason;
they were written by reading each question with its table and gold answer. The classifier's
rules were written on the labels at even positions, so the odd positions are the held-out
half and are reported separately.

Run ``python -m atp_jax.data.order_report DATA_DIR`` (``DATA_DIR`` holds ``wtq/dev.jsonl``,
``tatqa/dev.jsonl``, ``fetaqa/dev.jsonl``; default ``$ATP_JAX_DATA``) to print both.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from atp_jax.data.datasets import DATA_ENV_VAR, load_dataset
from atp_jax.data.order_filter import ORDER_FILTERS, is_order_dependent
from atp_jax.tables.table import Example

__all__ = ["LABELS_FILE", "Agreement", "agreement", "dropped", "load_order_labels", "main", "order_report"]

LABELS_FILE = "order_labels_wtq_dev.jsonl"
_LABEL_KEYS = ("id", "question", "order_dependent", "reason")


@dataclass(frozen=True)
class Agreement:
    """The classifier against the hand labels: the confusion counts (dependent is positive)."""

    true_positive: int
    false_negative: int
    false_positive: int
    true_negative: int

    @property
    def total(self) -> int:
        return self.true_positive + self.false_negative + self.false_positive + self.true_negative

    @property
    def correct(self) -> int:
        return self.true_positive + self.true_negative

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    def __str__(self) -> str:
        return (
            f"{self.correct}/{self.total} = {self.accuracy:.1%} (TP {self.true_positive}, "
            f"FN {self.false_negative}, FP {self.false_positive}, TN {self.true_negative})"
        )


def load_order_labels() -> list[dict]:
    """The bundled hand labels, in file order: dicts with ``id``, ``question``, ``order_dependent``, ``reason``."""
    resource = importlib.resources.files("atp_jax.data").joinpath(LABELS_FILE)
    labels = [json.loads(line) for line in resource.read_text(encoding="utf-8").splitlines() if line.strip()]
    for k, label in enumerate(labels, start=1):
        missing = [key for key in _LABEL_KEYS if key not in label]
        if missing:
            raise ValueError(f"{LABELS_FILE}:{k}: missing {', '.join(missing)}")
    return labels


def agreement(
    labels: Sequence[Mapping], examples: Mapping[str, Example], classify: Callable[[Example], bool] = is_order_dependent
) -> Agreement:
    """Count how ``classify`` agrees with ``labels`` on the examples they name (``examples`` by id).

    Raises:
        ValueError: when a labelled id is not in ``examples`` (the labels are for WTQ dev).
    """
    counts = {(truth, guess): 0 for truth in (True, False) for guess in (True, False)}
    for label in labels:
        if label["id"] not in examples:
            raise ValueError(
                f"labelled question {label['id']!r} is not in the examples given; "
                "the labels are for the WTQ dev split (wtq/dev.jsonl)"
            )
        counts[(bool(label["order_dependent"]), classify(examples[label["id"]]))] += 1
    return Agreement(counts[(True, True)], counts[(True, False)], counts[(False, True)], counts[(False, False)])


def dropped(examples: Sequence[Example], rule: str) -> int:
    """How many of ``examples`` the order rule ``rule`` (a name in ``ORDER_FILTERS``) would drop."""
    depends_on_order = ORDER_FILTERS[rule]
    return sum(map(depends_on_order, examples))


def order_report(data_dir: str | os.PathLike[str]) -> str:
    """The agreement on both halves of the labels and each rule's dropped fraction per dataset, as text."""
    wtq = load_dataset("wtq", "dev", data_dir)
    labels = load_order_labels()
    by_id = {example.id: example for example in wtq}
    dependent = sum(label["order_dependent"] for label in labels)
    lines = [
        f"hand labels: {len(labels)} keyword-flagged WTQ dev questions, {dependent} order-dependent",
        f"  rules written on even positions: {agreement(labels[0::2], by_id)}",
        f"  held-out odd positions:          {agreement(labels[1::2], by_id)}",
        f"  all:                             {agreement(labels, by_id)}",
        "dropped (whole dev split):",
    ]
    for name in ("wtq", "tatqa", "fetaqa"):
        examples = wtq if name == "wtq" else load_dataset(name, "dev", data_dir)
        fractions = ", ".join(
            f"{rule} {n}/{len(examples)} = {n / len(examples):.1%}"
            for rule in ORDER_FILTERS
            for n in [dropped(examples, rule)]
        )
        lines.append(f"  {name}: {fractions}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "data_dir",
        nargs="?",
        type=Path,
        default=os.environ.get(DATA_ENV_VAR),
        help=f"folder with wtq/, tatqa/, fetaqa/ dev.jsonl (default: ${DATA_ENV_VAR})",
    )
    args = parser.parse_args(argv)
    if args.data_dir is None:
        parser.error(f"pass DATA_DIR or set {DATA_ENV_VAR}")
    print(order_report(args.data_dir))


if __name__ == "__main__":
    main()
