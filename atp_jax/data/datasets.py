"""Load table-QA examples and select the ones an order attack is meant for.

Sources
-------
* JSONL files in the project schema, one object per line::

      {"id": str, "dataset": "wtq"|"tatqa"|"fetaqa", "question": str,
       "answers": [str, ...], "table": {"header": [str, ...], "rows": [[str, ...], ...]},
       "meta": {...}}

  ``meta`` is optional; the other keys are required. ``dataset`` selects the metric, so a record
  without it is refused unless the caller names the dataset (``load_jsonl(path, dataset="wtq")``).
* :func:`load_dataset` by name: ``"sample"`` (about 180 WTQ dev questions bundled with
  the package), ``"wtq"``, ``"tatqa"`` or ``"fetaqa"`` (read from a data directory laid
  out as ``<data_dir>/<name>/<split>.jsonl``, or from a checkout of the dataset's official
  repository: :mod:`atp_jax.data.releases`), a path to a ``.jsonl`` file, or ``"hf:<id>"``.
* :func:`load_hf_dataset` for a Hugging Face Hub dataset, for users with hub access
  (``load_dataset("hf:<id>")`` calls it).

Order-dependent questions
-------------------------
:func:`filter_examples` can drop the questions whose answer depends on the table's order.
The rules live in :mod:`atp_jax.data.order_filter`: ``"classifier"`` (the default,
:func:`~atp_jax.data.order_filter.is_order_dependent`, which reads the question and the
table) and ``"keywords"`` (the paper's keyword rule, :func:`is_order_sensitive`, re-exported
here with :data:`ORDER_KEYWORDS` and :data:`ORDER_EXCLUSIONS`).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from atp_jax.data.order_filter import (
    DEFAULT_ORDER_FILTER,
    ORDER_EXCLUSIONS,
    ORDER_FILTERS,
    ORDER_KEYWORDS,
    is_order_sensitive,
    order_rule,
)
from atp_jax.data.registry import dataset_names, dataset_spec
from atp_jax.data.releases import Release
from atp_jax.tables.table import Example, Table

__all__ = [
    "DATA_ENV_VAR",
    "dataset_choices",
    "ORDER_KEYWORDS",
    "ORDER_EXCLUSIONS",
    "ORDER_FILTERS",
    "DEFAULT_ORDER_FILTER",
    "DatasetUnavailableError",
    "DatasetSource",
    "HUB_PREFIX",
    "example_from_dict",
    "example_to_dict",
    "locate_dataset",
    "load_jsonl",
    "load_dataset",
    "load_hf_dataset",
    "is_order_sensitive",
    "filter_examples",
]

DATA_ENV_VAR = "ATP_JAX_DATA"
"""Environment variable naming the directory that holds ``wtq/``, ``tatqa/``, ``fetaqa/``."""

SAMPLE = "sample"  # the bundled WTQ dev subset
SAMPLE_DATASET = "wtq"
HUB_PREFIX = "hf:"
"""``--dataset hf:<id>`` loads a Hugging Face Hub dataset (:func:`load_hf_dataset`)."""
HUB_SPLITS = {"dev": "validation"}  # the hub's name for a split


def dataset_choices() -> tuple[str, ...]:
    """What ``--dataset`` takes by name: the bundled sample and every registered dataset."""
    return (SAMPLE, *dataset_names())


_SAMPLE_FILE = "wtq_sample.jsonl"
_REQUIRED_KEYS = ("id", "question", "answers", "table")


class DatasetUnavailableError(RuntimeError):
    """A dataset could not be obtained (missing files, no hub access, offline mode)."""


# --------------------------------------------------------------------------- JSONL


def example_from_dict(record: Mapping[str, Any]) -> Example:
    """Build an :class:`Example` from one record of the JSONL schema.

    Raises:
        ValueError: naming the first missing or malformed key.
        TypeError: for a cell or answer of the wrong type (from :class:`Table`/:class:`Example`).
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    missing = [key for key in _REQUIRED_KEYS if key not in record]
    if missing:
        raise ValueError(f"missing key {missing[0]!r} (required: {', '.join(_REQUIRED_KEYS)})")
    table = record["table"]
    if not isinstance(table, Mapping) or "header" not in table or "rows" not in table:
        raise ValueError("'table' must be an object with keys 'header' and 'rows'")
    answers = record["answers"]
    if not isinstance(answers, list):
        raise ValueError(f"'answers' must be a list of strings, got {type(answers).__name__}")
    meta = record.get("meta", {})
    if not isinstance(meta, Mapping):
        raise ValueError(f"'meta' must be an object, got {type(meta).__name__}")
    paragraphs = record.get("paragraphs", [])
    if not isinstance(paragraphs, list):
        raise ValueError(f"'paragraphs' must be a list of strings, got {type(paragraphs).__name__}")
    return Example(
        question=record["question"],
        table=Table(table["header"], table["rows"]),
        answers=tuple(answers),
        id=record["id"],
        meta=meta,
        dataset=record.get("dataset", ""),
        paragraphs=paragraphs,
    )


def example_to_dict(example: Example) -> dict[str, Any]:
    """The example as one record of the JSONL schema (``example_from_dict`` reads it back); ``paragraphs``
    only when it has some."""
    record = {
        "id": example.id,
        "dataset": example.dataset,
        "question": example.question,
        "answers": list(example.answers),
        "table": example.table.to_dict(),
        "meta": dict(example.meta),
    }
    if example.paragraphs:
        record["paragraphs"] = list(example.paragraphs)
    return record


def _check_dataset_name(dataset: str | None) -> None:
    if dataset is not None and dataset not in dataset_names():
        raise ValueError(f"dataset={dataset!r}: use one of {', '.join(dataset_names())}")


def _record_with_dataset(record: Any, dataset: str | None) -> Any:
    """The record with its ``dataset`` field checked, or filled from ``dataset`` when it has none."""
    if not isinstance(record, Mapping):
        return record  # example_from_dict names the problem.
    recorded = record.get("dataset")
    if recorded in (None, ""):
        if dataset is None:
            raise ValueError(
                f"no 'dataset' field, which selects the metric: add \"dataset\": one of {', '.join(dataset_names())} "
                "to each record, or pass the dataset explicitly (load_jsonl(path, dataset=...), "
                "load_dataset(path, dataset=...))"
            )
        return {**record, "dataset": dataset}
    if recorded not in dataset_names():
        raise ValueError(f"'dataset' is {recorded!r}: use one of {', '.join(dataset_names())}")
    if dataset is not None and recorded != dataset:
        raise ValueError(
            f"'dataset' is {recorded!r} but the file is loaded as {dataset!r}: fix the record, or load the "
            f"file as {recorded!r}"
        )
    return record


def load_jsonl(path: str | os.PathLike[str], dataset: str | None = None) -> list[Example]:
    """Read examples from a JSONL file in the project schema (blank lines are skipped).

    Args:
        path: the file.
        dataset: ``"wtq"``, ``"tatqa"`` or ``"fetaqa"`` fills the ``dataset`` field of records that lack
            it; a record that names another dataset is refused. None: every record must name its own.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: for a line that is not valid JSON, lacks a required key or the ``dataset`` field
            (without ``dataset=``), names an unknown or contradicting dataset, holds a malformed table, or
            repeats an earlier record's id (results are keyed by id); the message starts with
            ``<path>:<line number>:``.
    """
    _check_dataset_name(dataset)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such JSONL file: {path}")
    examples, first_line = [], {}
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{line_number}: invalid JSON ({error.msg} at column {error.colno})") from None
            try:
                example = example_from_dict(_record_with_dataset(record, dataset))
            except (ValueError, TypeError) as error:
                raise ValueError(f"{path}:{line_number}: {error}") from error
            if example.id in first_line:
                raise ValueError(
                    f"{path}:{line_number}: duplicate id {example.id!r} (first at line "
                    f"{first_line[example.id]}); give every record its own id: results are keyed by it"
                )
            first_line[example.id] = line_number
            examples.append(example)
    return examples


@dataclasses.dataclass(frozen=True)
class DatasetSource:
    """The files a named or JSONL dataset is read from: one project-schema JSONL file (``release`` None), or a
    checkout of the dataset's official repository (``path``) read by ``release``."""

    path: Path
    split: str
    dataset: str | None = None  # the records' dataset, where the source fixes it
    release: Release | None = None

    def files(self) -> tuple[Path, list[str]]:
        """``(folder, names inside it)`` of every file the examples are read from."""
        if self.release is None:
            return self.path.parent, [self.path.name]
        return self.path, self.release.files(self.path, self.split)

    def load(self, dataset: str | None = None) -> list[Example]:
        if self.release is None:
            return load_jsonl(self.path, dataset=dataset or self.dataset)
        return self.release.read(self.path, self.split)


def locate_dataset(
    name_or_path: str | os.PathLike[str],
    split: str = "dev",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: str | None = None,
) -> DatasetSource:
    """Where :func:`load_dataset` reads a named dataset or a ``.jsonl`` path from (arguments as there).

    A named dataset is ``<data_dir>/<name>/<split>.jsonl`` when that file exists, else the checkout of its
    official repository at ``data_dir`` or ``data_dir/<repository folder>`` (e.g. ``WikiTableQuestions/``).

    Raises:
        DatasetUnavailableError: no data directory, or neither layout there; the message names both.
        ValueError: an unknown name, or ``dataset`` contradicting a named dataset.
    """
    _check_dataset_name(dataset)
    if isinstance(name_or_path, os.PathLike) or str(name_or_path).endswith(".jsonl"):
        return DatasetSource(Path(name_or_path), split, dataset)
    name = str(name_or_path).lower()
    if name != SAMPLE and name not in dataset_names():
        raise ValueError(
            f"unknown dataset {name_or_path!r}: use one of {', '.join(dataset_choices())}, a path ending in .jsonl, "
            f"or {HUB_PREFIX}<hub id>"
        )
    own = SAMPLE_DATASET if name == SAMPLE else name
    if dataset is not None and dataset != own:
        raise ValueError(
            f"load_dataset({name_or_path!r}, dataset={dataset!r}): the {name!r} data is "
            f"{own!r}; drop dataset= or pass a .jsonl path"
        )
    if name == SAMPLE:
        if split != "dev":
            raise ValueError(f"the bundled sample has only the 'dev' split, not {split!r}")
        with importlib.resources.as_file(importlib.resources.files("atp_jax.data").joinpath(_SAMPLE_FILE)) as path:
            if not path.is_file():
                raise DatasetUnavailableError(
                    f"the bundled sample {_SAMPLE_FILE} is missing from the installed package; "
                    "reinstall atp-jax, or rebuild it with `python -m atp_jax.data.make_sample`"
                )
            return DatasetSource(Path(path), split, SAMPLE_DATASET)

    release = dataset_spec(name).release
    root = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR)
    layouts = f"<dir>/{name}/{split}.jsonl in the project JSONL schema"
    if release is not None:
        layouts += f", or a checkout of {release.repository} (<dir>/{release.split_files.get(split, '...')})"
    if not root:
        raise DatasetUnavailableError(
            f"no data directory for {name!r}: pass data_dir=... (--data_dir) or set {DATA_ENV_VAR} to {layouts}; "
            "load_dataset('sample') works without one"
        )
    path = Path(root) / name / f"{split}.jsonl"
    if path.is_file():
        return DatasetSource(path, split, name)
    checkout = release.checkout(root, split) if release is not None else None
    if checkout is not None:
        return DatasetSource(checkout, split, name, release)
    if release is not None and split not in release.split_files:
        raise DatasetUnavailableError(
            f"{path} not found, and the {release.repository} release has no split {split!r} "
            f"(it has {', '.join(release.split_files)})"
        )
    source = "data_dir" if data_dir is not None else DATA_ENV_VAR
    message = f"{path} not found ({source}={root}); put the {name} {split} split there in the project JSONL schema"
    if release is not None:
        message += (
            f", or point {source} at a checkout of {release.repository} (holding {release.split_file(split)}) or "
            f"at the folder holding it as {release.folder}/"
        )
    raise DatasetUnavailableError(message)


def load_dataset(
    name_or_path: str | os.PathLike[str],
    split: str = "dev",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: str | None = None,
) -> list[Example]:
    """Load a dataset by name, from a ``.jsonl`` path, or from the Hugging Face Hub.

    Args:
        name_or_path: ``"sample"`` (bundled WTQ dev subset; only ``split="dev"``),
            ``"wtq"``, ``"tatqa"``, ``"fetaqa"``, a path to a ``.jsonl`` file (then
            ``split`` and ``data_dir`` are ignored), or ``"hf:<hub id>"`` (:func:`load_hf_dataset`; the
            split ``"dev"`` is the hub's ``"validation"``).
        split: the split to read for a named dataset, e.g. ``"dev"``.
        data_dir: directory containing ``<name>/<split>.jsonl``, or a checkout of the dataset's official
            repository (or the folder holding it, e.g. ``WikiTableQuestions/``); defaults to the
            ``ATP_JAX_DATA`` environment variable.
        dataset: the dataset of the records, for a file whose records lack the ``dataset`` field (see
            :func:`load_jsonl`) and for hub records (default ``""``: scored as WTQ). A named dataset is its own
            (``"sample"`` is WTQ); naming another is refused.

    Raises:
        DatasetUnavailableError: when no data directory is configured or the files are
            missing (the message says where they are expected), or the hub cannot be used.
        ValueError: for an unknown name, or a malformed file (see :func:`load_jsonl`).
    """
    name = str(name_or_path)
    if name.startswith(HUB_PREFIX):
        _check_dataset_name(dataset)
        hub_id = name.removeprefix(HUB_PREFIX)
        if not hub_id:
            raise ValueError(f"{name!r}: name the hub dataset, e.g. {HUB_PREFIX}owner/name")
        if data_dir is not None:
            raise ValueError(f"data_dir={data_dir} is for local files; a {HUB_PREFIX} dataset comes from the hub")
        return load_hf_dataset(hub_id, HUB_SPLITS.get(split, split), dataset=dataset or "")
    return locate_dataset(name_or_path, split, data_dir, dataset).load(dataset)


# --------------------------------------------------------------------------- Hub

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
_PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _probe_hub(hub_id: str, timeout: float) -> None:
    """Fail within ``timeout`` seconds when the hub endpoint cannot be reached.

    Without this, a network that silently drops packets makes the first hub request
    wait for the library's own (longer) timeouts. Skipped behind a proxy, where a direct
    connection says nothing about reachability.
    """
    if any(os.environ.get(var) for var in _PROXY_VARS):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urllib.parse.urlsplit(endpoint)
    host = parsed.hostname
    if not host:
        raise DatasetUnavailableError(f"HF_ENDPOINT={endpoint!r} is not a URL")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as error:
        raise DatasetUnavailableError(
            f"{hub_id!r}: cannot reach the Hugging Face Hub at {endpoint} within {timeout:g}s ({error}); "
            "check the network, or load local files with load_dataset(name, data_dir=...)"
        ) from None


def _hub_record_to_example(record: Mapping[str, Any], index: int, hub_id: str, dataset: str) -> Example:
    """Map common hub table-QA schemas (WTQ-style ``table`` dict or FeTaQA ``table_array``)."""
    if "question" not in record:
        raise ValueError("no 'question' field")
    if "answers" in record:
        answers = record["answers"]
    elif "answer" in record:
        answers = record["answer"]
    else:
        raise ValueError("no 'answers' or 'answer' field")
    if not isinstance(answers, list):
        answers = [answers]
    table = record.get("table")
    if isinstance(table, Mapping) and "header" in table and "rows" in table:
        header, rows = table["header"], table["rows"]
    elif isinstance(record.get("table_array"), list) and record["table_array"]:
        header, *rows = record["table_array"]
    else:
        raise ValueError("no 'table' {header, rows} or 'table_array' field")
    id_value = next((record[k] for k in ("id", "uid", "feta_id") if k in record), None)
    used = {"question", "answers", "answer", "table", "table_array", "id", "uid", "feta_id"}
    return Example(
        question=record["question"],
        table=Table(header, rows),
        answers=tuple(str(a) for a in answers),
        id=str(id_value) if id_value is not None else f"{hub_id}:{index}",
        meta={k: v for k, v in record.items() if k not in used},
        dataset=dataset,
    )


def load_hf_dataset(
    hub_id: str,
    split: str,
    *,
    config: str | None = None,
    dataset: str = "",
    converter: Callable[[Mapping[str, Any], int], Example] | None = None,
    connect_timeout: float = 5.0,
) -> list[Example]:
    """Load a Hugging Face Hub dataset with the ``datasets`` library.

    Records are converted with ``converter(record, index)``; the default handles
    records with ``question``, ``answers``/``answer`` and either ``table: {header, rows}``
    (e.g. WikiTableQuestions) or ``table_array`` (FeTaQA, first row = header).

    The call fails fast instead of hanging: in offline mode (``HF_HUB_OFFLINE``,
    ``HF_DATASETS_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set) only the local cache is
    tried; online, the hub endpoint (``HF_ENDPOINT``) must accept a connection within
    ``connect_timeout`` seconds. Later requests use the hub library's own timeouts
    (``HF_HUB_ETAG_TIMEOUT``, ``HF_HUB_DOWNLOAD_TIMEOUT``, 10 s by default).

    Raises:
        DatasetUnavailableError: offline without a cached copy, or hub unreachable.
        ValueError: when a record cannot be converted (names the record and its keys).
    """
    offline = any(_env_true(var) for var in _OFFLINE_VARS)
    if not offline:
        _probe_hub(hub_id, connect_timeout)
    import datasets  # Imported lazily: it is slow to import and only needed here.

    try:
        hub_data = datasets.load_dataset(hub_id, config, split=split)
    except Exception as error:  # The library raises many types; all mean "not available".
        if offline:
            raise DatasetUnavailableError(
                f"{hub_id!r} (split {split!r}) is not in the local Hugging Face cache and "
                "offline mode is on; unset HF_HUB_OFFLINE/HF_DATASETS_OFFLINE on a machine "
                "with hub access, or use load_dataset(name, data_dir=...) with local files "
                f"({type(error).__name__}: {error})"
            ) from None
        raise DatasetUnavailableError(
            f"could not load {hub_id!r} split {split!r} from the hub: {type(error).__name__}: {error}"
        ) from error

    convert = converter or (lambda rec, i: _hub_record_to_example(rec, i, hub_id, dataset))
    examples = []
    for index, record in enumerate(hub_data):
        try:
            examples.append(convert(record, index))
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(
                f"record {index} of {hub_id!r} could not be converted ({error}); its keys are "
                f"{sorted(record)}; pass converter=... to map this schema to Example"
            ) from error
    return examples


# --------------------------------------------------------------------------- filters


def filter_examples(
    examples: Iterable[Example],
    order_sensitive: bool | None = None,
    max_rows: int | None = None,
    max_cols: int | None = None,
    max_cell_chars: int | None = None,
    order_filter: str = DEFAULT_ORDER_FILTER,
) -> list[Example]:
    """Keep the examples that pass every given criterion (``None`` disables one).

    Args:
        examples: examples to filter; the order is kept.
        order_sensitive: ``True`` keeps only the questions whose answer depends on the
            table's order (by ``order_filter``), ``False`` only the others.
        max_rows: the largest number of data rows allowed (the header is not counted).
        max_cols: the largest number of columns allowed.
        max_cell_chars: the longest cell allowed, header included, in characters.
        order_filter: the order rule, a name in :data:`ORDER_FILTERS`: ``"classifier"``
            (question and table) or ``"keywords"`` (the paper's keyword rule).

    Raises:
        ValueError: for a negative or non-int limit, or an unknown ``order_filter``.
    """
    depends_on_order = order_rule(order_filter)
    limits = {"max_rows": max_rows, "max_cols": max_cols, "max_cell_chars": max_cell_chars}
    for name, limit in limits.items():
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"{name} must be a non-negative int or None, got {limit!r}")
    kept = []
    for example in examples:
        table = example.table
        if order_sensitive is not None and depends_on_order(example) != order_sensitive:
            continue
        if max_rows is not None and table.n_rows > max_rows:
            continue
        if max_cols is not None and table.n_cols > max_cols:
            continue
        if max_cell_chars is not None and any(len(cell) > max_cell_chars for row in table.cells for cell in row):
            continue
        kept.append(example)
    return kept
