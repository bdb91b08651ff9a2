"""Experiment tracking: each record, as it is written, also goes to TensorBoard event files or a W&B run.

A sink is optional and never the record of truth (``results.jsonl`` is): it gets
``write(record, position, name)`` for every record of the run (``position``: the example's index among this
process's examples; ``name``: what the record is shown as, its attack unless a sweep sets it apart) and
``close()`` at the end. It logs at ``step = process_index + process_count × position``, the example's index in
the whole selection (process K of N takes every N-th example from the K-th), so a step means the same example in
every process and every session of a run.

What is written, per record named ``A`` (skipped records write nothing):

* scalars ``A/answer_loss``, ``A/clean_loss``, ``A/queries``, ``A/backward_calls``, ``A/seconds``,
  ``A/score/<metric>`` for each numeric score, ``A/defended/<smooth_kK>/<metric>`` under the smoothing
  defense, and ``A/trace/<key>`` for each number in the attack's trace, at ``step``;
* the attack's trace as series (``trace_series``): ``A/<series>`` at steps 0, 1, … of the series.

TensorBoard (``TensorBoardSink``, through tensorboardX, which needs no TensorFlow): the scalars go to the run
``DIR`` (``DIR/process_K`` for process K of several: one event file per writer), each example's trace series to
the run ``DIR/traces/<example id>``; TensorBoard keeps letters, digits and ``-_./`` in a tag and writes ``_``
for anything else (``best_of_k@k=27/answer_loss`` is shown as ``best_of_k_k_27/answer_loss``).

W&B (``WandbSink``): one run per process (grouped by the results folder), the scalars logged against
``example``, the trace series as one table logged when the run closes.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from atp_jax.runs.records import AttackRecord, SkipRecord

_RECORD_SCALARS = ("answer_loss", "clean_loss", "queries", "backward_calls", "seconds")

# The package each backend needs, and how to install it.
TENSORBOARD = ("tensorboardX", "pip install 'atp-jax[tensorboard]' (or tensorboardX)")
WANDB = ("wandb", "pip install wandb, then wandb login (or set WANDB_MODE=offline)")


class TrackingError(RuntimeError):
    """A tracking backend cannot be used (not installed, not logged in); the message says what to do."""


class RecordSink(Protocol):
    """Where records go besides the results folder."""

    def write(self, record: AttackRecord | SkipRecord, position: int, name: str) -> None: ...

    def close(self) -> None: ...


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def record_scalars(record: AttackRecord, name: str) -> dict[str, float]:
    """The record's numbers by tag, under ``name`` (``name/answer_loss``, ``name/score/accuracy``, …)."""
    out = {f"{name}/{field}": float(getattr(record, field)) for field in _RECORD_SCALARS}
    out |= {f"{name}/score/{k}": float(v) for k, v in record.scores.items() if _is_number(v)}
    for defense, answer in (record.defended or {}).items():
        scores = answer.get("scores") or {}
        out |= {f"{name}/defended/{defense}/{k}": float(v) for k, v in scores.items() if _is_number(v)}
    out |= {f"{name}/trace/{k}": float(v) for k, v in record.trace.items() if _is_number(v)}
    return out


def trace_series(trace: Mapping[str, Any]) -> dict[str, list[float]]:
    """The trace's per-step sequences by name: a list of numbers as it is (``losses``), a list of lists one
    series per restart (``loss/restart_0``, …), a list of dicts one series per numeric field (``steps/gain``)."""
    series = {}
    for key, value in trace.items():
        if not isinstance(value, list) or not value:
            continue
        if all(_is_number(v) for v in value):
            series[key] = [float(v) for v in value]
        elif all(isinstance(v, list) and all(_is_number(x) for x in v) for v in value):
            series |= {f"{key}/restart_{r}": [float(x) for x in v] for r, v in enumerate(value)}
        elif all(isinstance(v, dict) for v in value):
            fields = [f for f in value[0] if all(_is_number(v.get(f)) for v in value)]
            series |= {f"{key}/{f}": [float(v[f]) for v in value] for f in fields}
    return series


def _step(position: int, process_index: int, process_count: int) -> int:
    """The index in the whole selection of this shard's ``position``-th example."""
    return process_index + process_count * position


def missing_message(package: str, install: str) -> str:
    """What to tell a user whose backend ``package`` is not installed."""
    return f"needs the {package} package, which is not installed: {install}"


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (checked without importing it)."""
    return importlib.util.find_spec(package) is not None


def _import(flag: str, package: str, install: str):
    if not installed(package):
        raise TrackingError(f"{flag} {missing_message(package, install)}")
    return importlib.import_module(package)


def _run_name(example_id: str) -> str:
    """An example id as one folder name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", example_id) or "_"


class TensorBoardSink:
    """Writes the scalars and trace series of every record as TensorBoard event files under ``directory``."""

    def __init__(self, directory: str | Path, process_index: int = 0, process_count: int = 1):
        self._writer_class = _import("--tensorboard_dir", *TENSORBOARD).SummaryWriter
        self.directory = Path(directory)
        self._shard = (process_index, process_count)
        self.scalars_dir = self.directory / f"process_{process_index}" if process_count > 1 else self.directory
        self._scalars = self._writer_class(logdir=str(self.scalars_dir))

    def write(self, record: AttackRecord | SkipRecord, position: int, name: str) -> None:
        if not isinstance(record, AttackRecord):
            return
        step = _step(position, *self._shard)
        for tag, value in record_scalars(record, name).items():
            self._scalars.add_scalar(tag, value, global_step=step)
        self._scalars.flush()
        series = trace_series(record.trace)
        if series:
            with self._writer_class(logdir=str(self.directory / "traces" / _run_name(record.id))) as traces:
                for series_name, values in series.items():
                    for index, value in enumerate(values):
                        traces.add_scalar(f"{name}/{series_name}", value, global_step=index)

    def close(self) -> None:
        self._scalars.close()


class WandbSink:
    """Logs the scalars of every record to a W&B run (one per process), and the trace series as a table."""

    def __init__(
        self,
        project: str,
        directory: str | Path,
        config: Mapping[str, Any],
        process_index: int = 0,
        process_count: int = 1,
    ):
        self._wandb = _import("--wandb_project", *WANDB)
        directory = Path(directory)
        name = directory.name if process_count == 1 else f"{directory.name}/process_{process_index}"
        try:
            self._run = self._wandb.init(
                project=project, name=name, group=directory.name, dir=str(directory), config=dict(config)
            )
        except Exception as e:  # wandb raises its own error types (no login, no network, bad project name)
            raise TrackingError(
                f"--wandb_project {project}: W&B could not start a run ({e}); run `wandb login`, or set "
                "WANDB_MODE=offline to keep the run on disk (wandb sync uploads it later)"
            ) from None
        self._run.define_metric("example")
        self._run.define_metric("*", step_metric="example")
        self._shard = (process_index, process_count)
        self._trace_rows = []

    def write(self, record: AttackRecord | SkipRecord, position: int, name: str) -> None:
        if not isinstance(record, AttackRecord):
            return
        self._run.log({**record_scalars(record, name), "example": _step(position, *self._shard)})
        for series, values in trace_series(record.trace).items():
            self._trace_rows += [[record.id, name, series, index, value] for index, value in enumerate(values)]

    def close(self) -> None:
        if self._trace_rows:
            columns = ["example_id", "name", "series", "step", "value"]
            self._run.log({"traces": self._wandb.Table(columns=columns, data=self._trace_rows)})
        self._run.finish()
