"""The datasets the toolkit knows: what each one is scored with and how its answers are asked for.

A dataset is one ``DatasetSpec`` and one ``register_dataset`` line. Its records are project-schema JSONL
files (``<data_dir>/<name>/<split>.jsonl``, read by :func:`atp_jax.data.datasets.load_dataset`) or, with a
``release`` (:mod:`atp_jax.data.releases`), the files of its official repository's checkout; its
``metrics`` name entries of the metric registry (:mod:`atp_jax.eval.scoring`) that ``--metrics auto``
records; ``required_meta`` lists the ``meta`` keys those metrics cannot score without; ``normalize`` is
the answer form that votes and evidence matching compare; ``answer_instruction``, when set, replaces the
answer wording of the prompt under ``PromptStyle(answer_format="dataset")`` (the prompt adds how to
separate several answers either way; registering hands it to :mod:`atp_jax.tables.prompt`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from atp_jax.data.releases import Release, fetaqa, tatqa, wtq
from atp_jax.tables.normalize import normalize_wtq
from atp_jax.tables.prompt import register_answer_instruction


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    name: str
    metrics: tuple[str, ...]
    normalize: Callable[[str], str] = normalize_wtq
    required_meta: tuple[str, ...] = ()
    answer_instruction: str | None = None
    citation: str = ""
    release: Release | None = None


_DATASETS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec) -> DatasetSpec:
    """Adds ``spec`` under its name (lower case); registering a name twice is refused."""
    name = spec.name.lower()
    if name in _DATASETS or name == "sample":
        raise ValueError(f"dataset {spec.name!r} is already registered")
    _DATASETS[name] = dataclasses.replace(spec, name=name)
    if spec.answer_instruction:
        register_answer_instruction(name, spec.answer_instruction)
    return _DATASETS[name]


def dataset_names() -> tuple[str, ...]:
    """The registered datasets, in registration order."""
    return tuple(_DATASETS)


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of ``name`` (case-insensitive); ``ValueError`` naming the registered ones."""
    spec = _DATASETS.get(str(name).lower())
    if spec is None:
        raise ValueError(
            f"dataset {name!r} is not registered: use one of {', '.join(_DATASETS)} "
            "(or register it: atp_jax.data.registry.register_dataset)"
        )
    return spec


# Votes compare answers in one folded surface form for every dataset (Unicode, quotes, dashes, case):
# the datasets' own normalisers belong to their official metrics, which score, not vote.
register_dataset(
    DatasetSpec(
        "wtq",
        metrics=("denotation",),
        citation="Pasupat & Liang, Compositional Semantic Parsing on Semi-Structured Tables, ACL 2015",
        release=wtq.RELEASE,
    )
)
# TAT-QA's metric gives 0 to a bare number whose gold has a scale (1.5 for "1.5 million"), so the scale is
# asked for; WTQ and FeTaQA keep the generic wording, with which their committed records were made.
register_dataset(
    DatasetSpec(
        "tatqa",
        metrics=("em_f1",),
        required_meta=("scale",),
        answer_instruction="Write a number with its scale word (thousand, million or billion) when the table "
        "states one, e.g. '1.5 million', and a percentage with a percent sign, e.g. '12.5%'; write text answers "
        "as they appear in the table.",
        citation="Zhu et al., TAT-QA: A Question Answering Benchmark on a Hybrid of Tabular and Textual Content "
        "in Finance, ACL 2021",
        release=tatqa.RELEASE,
    )
)
register_dataset(
    DatasetSpec(
        "fetaqa",
        metrics=("rouge",),
        citation="Nan et al., FeTaQA: Free-form Table Question Answering, TACL 2022",
        release=fetaqa.RELEASE,
    )
)


def answer_normalizer(dataset: str) -> Callable[[str], str]:
    """The answer normaliser of ``dataset``; an example without a (registered) dataset gets WTQ's."""
    spec = _DATASETS.get(str(dataset).lower())
    return (spec or _DATASETS["wtq"]).normalize
