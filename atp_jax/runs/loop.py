"""The resumable loop every attack binary runs: each (example, attack) not yet recorded in its results folder
is attacked and its record appended at once, so a killed run loses at most the attack in flight."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from tqdm import tqdm

from atp_jax.attack.config import AttackConfig
from atp_jax.compilation import CompileTotals, compile_totals
from atp_jax.inference.server import ServerVictim
from atp_jax.models.loading import LoadedModel
from atp_jax.runs.blackbox import run_one_server
from atp_jax.runs.experiment import run_group, run_one
from atp_jax.runs.manifest import ResultsFolder
from atp_jax.runs.records import AttackRecord, SkipRecord
from atp_jax.runs.tracking import RecordSink
from atp_jax.tables.buckets import DEFAULT_BUCKETS
from atp_jax.tables.layout import build_layout
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example


@dataclasses.dataclass(frozen=True)
class Job:
    """One attack spec, recorded into ``folder``; tracking sinks show its records as ``tracking_name`` (default:
    the attack's name; a sweep over several folders sets the folder apart)."""

    folder: ResultsFolder
    name: str
    config: AttackConfig
    tracking_name: str = ""


def pending(examples: Sequence[Example], jobs: Sequence[Job]) -> list[tuple[Example, Job]]:
    """The (example, job) pairs their folders have not recorded, in run order (example by example)."""
    done = {folder: folder.done_keys() for folder in {job.folder for job in jobs}}
    return [(ex, job) for ex in examples for job in jobs if (ex.id, job.name) not in done[job.folder]]


def run_pending(
    model: LoadedModel | ServerVictim,
    examples: Sequence[Example],
    jobs: Sequence[Job],
    style: PromptStyle,
    *,
    on_record: Callable[[AttackRecord | SkipRecord], dict | None] | None = None,
    sinks: Sequence[RecordSink] = (),
    progress: bool = True,
    desc: str = "attacking",
    batch_examples: int = 1,
    **run_options,
) -> int:
    """Runs every pending (example, job) with ``run_one(..., **run_options)`` (against a ``ServerVictim``:
    ``run_one_server``); returns how many ran.

    An example's precomputation is shared by its attacks; each record carries the compiles it cost
    (``compiles``). Each record, once in its folder, goes to every sink (``atp_jax.runs.tracking``) with the
    example's index in ``examples``; ``on_record`` sees it then and may return a progress-bar postfix.
    ``progress=False`` hides the bar (processes other than the first of a sharded run).

    ``batch_examples`` > 1 attacks that many examples at once (``run_group``: each attack vmapped over the
    examples of a shape bucket — what keeps an accelerator busy); the records are the same as one at a time.
    """
    if batch_examples < 1:
        raise ValueError(f"batch_examples={batch_examples} must be at least 1")
    if batch_examples > 1 and isinstance(model, ServerVictim):
        raise ValueError("batch_examples batches examples on an in-process model; a server victim takes one at a time")
    todo = pending(examples, jobs)
    position = {example.id: index for index, example in enumerate(examples)}
    bar = tqdm(total=len(todo), desc=desc, disable=not progress)

    def emit(example: Example, job: Job, record: AttackRecord | SkipRecord) -> None:
        job.folder.append(record)
        for sink in sinks:
            sink.write(record, position[example.id], job.tracking_name or job.name)
        postfix = on_record(record) if on_record is not None else None
        if postfix:
            bar.set_postfix(postfix, refresh=False)
        bar.update()

    if batch_examples > 1:
        _run_batched(model, todo, jobs, style, batch_examples, emit, run_options)
        bar.close()
        return len(todo)
    current, problems = None, {}
    for example, job in todo:
        if example.id != current:  # pending() runs example by example: the previous one's precomputation is done with
            current, problems = example.id, {}
        before = compile_totals()
        run = run_one_server if isinstance(model, ServerVictim) else run_one
        record = run(model, example, job.name, job.config, style, problems=problems, **run_options)
        if isinstance(record, AttackRecord):
            record = dataclasses.replace(record, compiles=(compile_totals() - before).as_dict())
        emit(example, job, record)
    bar.close()
    return len(todo)


def _run_batched(model: LoadedModel, todo, jobs, style, batch_examples: int, emit, run_options: dict) -> None:
    """``batch_examples`` examples at a time, each job run on them together (``run_group``), examples of a shape
    bucket next to each other so that groups fill. A group's compiles are recorded on its first record."""
    examples = list({example.id: example for example, _ in todo}.values())
    wanted = {(example.id, job.name, job.folder) for example, job in todo}
    buckets = run_options.get("buckets", DEFAULT_BUCKETS)
    examples = sorted(examples, key=lambda example: _bucket_rank(model, example, style, buckets))
    for start in range(0, len(examples), batch_examples):
        window = examples[start : start + batch_examples]
        problems: dict[str, dict] = {}
        for job in jobs:
            members = [ex for ex in window if (ex.id, job.name, job.folder) in wanted]
            if not members:
                continue
            before = compile_totals()
            records = run_group(model, members, job.name, job.config, style, problems=problems, **run_options)
            compiles = (compile_totals() - before).as_dict()
            for example, record in zip(members, records):
                if isinstance(record, AttackRecord):
                    record = dataclasses.replace(record, compiles=compiles)
                    compiles = CompileTotals().as_dict()
                emit(example, job, record)


def _bucket_rank(model: LoadedModel, example: Example, style: PromptStyle, buckets) -> tuple:
    """A sort key that puts examples of one shape bucket together (their reference-answer layout's bucket)."""
    try:
        sizes = build_layout(model.tokenizer, example, style=style).sizes
    except Exception:  # an example its layout cannot take: its attacks record why; sorted last
        return (1,)
    return (0, dataclasses.astuple(buckets.fit(sizes) if buckets is not None else sizes))
