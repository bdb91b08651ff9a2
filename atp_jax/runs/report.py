"""Summaries of result records: per-run attack summaries, compile costs, and the paper's score tables over
results folders — models as rows, the paper's attack columns under the paper's names, BCa bootstrap intervals
(:mod:`atp_jax.stats`), paired comparisons — as markdown, CSV, LaTeX (booktabs) and a bar chart (PDF and PNG).
Reading folders is :mod:`atp_jax.runs.folders`; sweeps :mod:`atp_jax.runs.ablation`; the defense
:mod:`atp_jax.runs.defense_report`."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from atp_jax.attack import registry
from atp_jax.attack.presets import ATTACK_GROUPS, attack_config, control_pairs
from atp_jax.plotting import new_figure, save_figure
from atp_jax.runs.folders import Run
from atp_jax.stats import MIN_VALUES, bootstrap_interval, has_interval

REFERENCE_ATTACK = "best_of_k"
SCORE_METRICS = ("accuracy", "em", "rougeL_recall")  # the default metric: the first one recorded
LOSS_METRIC = "answer_loss"

# The paper's column names for the presets of its table (Tables 1, 2 and 4), in its order; other attacks keep
# their ids. A preset with other settings (best_of_k@k=40) is another attack and keeps its id.
PAPER_COLUMNS = dict(
    zip(
        ATTACK_GROUPS["paper_table"],
        ("Vanilla", "Rand", "Best 20", "Row Rvs", "Col Rvs", "E-Search", "ATP Row", "ATP Col", "ATP Row&Col"),
        strict=True,
    )
)


TRANSFER_SEPARATOR = " from "  # a replayed order's column: "<attack> from <source model>"


def column_name(attack: str) -> str:
    """The paper's name of ``attack``'s column, else its id; a transferred attack's column keeps its source."""
    attack, separator, source = attack.partition(TRANSFER_SEPARATOR)
    return PAPER_COLUMNS.get(attack, attack) + separator + source


def column_key(record: dict) -> str:
    """The column ``record`` fills: its attack, or for an order replayed from another model (``atp-transfer``)
    ``"<attack> from <source model>"``, as the paper's closed-model tables show transfers."""
    source = record.get("transferred_from") or {}
    return f"{record['attack']}{TRANSFER_SEPARATOR}{source['model']}" if source.get("model") else record["attack"]


def paper_order(attacks: Iterable[str]) -> list[str]:
    """``attacks`` with the paper's columns first, in its order, then the others as given."""
    attacks = list(dict.fromkeys(attacks))
    return [a for a in PAPER_COLUMNS if a in attacks] + [a for a in attacks if a not in PAPER_COLUMNS]


def interval_text(low: float, high: float) -> str:
    """``[low, high]`` signed to 3 decimals, or ``[n/a]`` where the interval is undefined."""
    return f"[{low:+.3f}, {high:+.3f}]" if has_interval(low, high) else "[n/a]"


def _is_score(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summarize(records: Iterable[dict], reference: str = REFERENCE_ATTACK, original: str = "vanilla") -> list[dict]:
    """Per attack: examples, mean true loss, mean of each score, how often it beats ``reference`` on the
    same example (strictly higher loss), how many of the answers the ``original`` order got right it broke
    (``broken``: full marks on the first score under the original order, less under the attack's), mean
    forward/backward calls and seconds."""
    by_attack: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_attack[r["attack"]].append(r)
    ref_loss = {r["id"]: r["answer_loss"] for r in by_attack.get(reference, [])}
    original_right = _right_answers(by_attack.get(original, []))
    rows = []
    for attack, recs in by_attack.items():
        row = {
            "attack": attack,
            "examples": len(recs),
            "mean_loss": statistics.fmean(r["answer_loss"] for r in recs),
            "queries": statistics.fmean(r["queries"] for r in recs),
            "backward_calls": statistics.fmean(r.get("backward_calls", 0) for r in recs),
            "seconds": statistics.fmean(r["seconds"] for r in recs),
        }
        # Scores are numbers; text beside them (a judge's reason and raw reply for a null score) is not averaged.
        for metric in sorted({m for r in recs for m, v in r.get("scores", {}).items() if _is_score(v) or v is None}):
            values = [r["scores"][metric] for r in recs if _is_score(r["scores"].get(metric))]
            row[metric] = statistics.fmean(values) if values else float("nan")
        paired = [r for r in recs if r["id"] in ref_loss]
        if attack != reference and paired:
            row[f"beats_{reference}"] = f"{sum(r['answer_loss'] > ref_loss[r['id']] for r in paired)}/{len(paired)}"
        right = [r for r in recs if r["id"] in original_right and _primary_score(r) is not None]
        if attack != original and right:
            row["broken"] = f"{sum(_primary_score(r) < original_right[r['id']] for r in right)}/{len(right)}"
        rows.append(row)
    return rows


def first_score(scores: dict) -> float | None:
    """The first numeric score of one answer's scores (the dataset's own metric comes first: WTQ accuracy, TAT-QA
    EM, …; the judge's when it is the only metric); None when there is none."""
    for value in scores.values():
        if _is_score(value):
            return float(value)
    return None


def _primary_score(record: dict) -> float | None:
    return first_score(record.get("scores") or {})


def _right_answers(records: Iterable[dict]) -> dict[str, float]:
    """Examples whose record scores full marks on its first score: id -> that score."""
    return {r["id"]: s for r in records if (s := _primary_score(r)) is not None and s >= 1.0}


def broken_answers(records: Iterable[dict], reference: str = "vanilla") -> list[dict]:
    """The answers an attack broke: per (example, attack), where the ``reference`` order's answer has full marks
    on the first score and the attack's order's answer less — the question, both answers and the attack's score."""
    records = [r for r in records if "skipped" not in r]
    ref = {r["id"]: r for r in records if r["attack"] == reference}
    right = _right_answers(ref.values())
    rows = []
    for r in records:
        if r["attack"] == reference or r["id"] not in right or (score := _primary_score(r)) is None:
            continue
        if score < right[r["id"]]:
            rows.append(
                {
                    "id": r["id"],
                    "attack": r["attack"],
                    f"{reference}_answer": ref[r["id"]].get("prediction"),
                    "attacked_answer": r.get("prediction"),
                    "score": score,
                }
            )
    return rows


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no records)"
    columns = list(dict.fromkeys(k for row in rows for k in row))
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def compile_rows(records: Iterable[dict]) -> list[dict]:
    """Per attack, over the records that carry ``compiles``: the XLA programs they built (persistent-cache
    hits among them), the seconds tracing, lowering and compiling, and the attacks' own seconds."""
    by_attack: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("compiles"):
            by_attack[record["attack"]].append(record)
    rows = []
    for attack, recs in by_attack.items():
        total = {key: sum(r["compiles"][key] for r in recs) for key in recs[0]["compiles"]}
        rows.append(
            {
                "attack": attack,
                "records": len(recs),
                "programs": total["programs"],
                "cache_hits": total["cache_hits"],
                "trace_s": total["trace_seconds"],
                "lower_s": total["lower_seconds"],
                "compile_s": total["compile_seconds"],
                "attack_s": sum(r["seconds"] for r in recs),
            }
        )
    return rows


def agreement_rows(reference: Iterable[dict], other: Iterable[dict]) -> list[dict]:
    """How far a second run of the same attacks on the same questions is from a first, per attack, over the
    (example, attack) pairs both recorded: mean and largest |Δ| of the chosen order's reference-answer loss and
    of the original order's, how often the two chose the same order, and the second run's time (attacks and
    compiles) over the first's. For a numeric change (bfloat16 against float32) or a code change (before
    and after), measured on the same questions."""
    first = {(r["id"], r["attack"]): r for r in reference if "skipped" not in r}
    rows: dict[str, dict] = {}
    for record in other:
        key = (record.get("id"), record.get("attack"))
        if "skipped" in record or key not in first:
            continue
        a, b = first[key], record
        row = rows.setdefault(
            key[1], {"attack": key[1], "pairs": 0, "dloss": [], "dclean": [], "same": 0, "s_a": 0.0, "s_b": 0.0}
        )
        row["pairs"] += 1
        row["dloss"].append(abs(b["answer_loss"] - a["answer_loss"]))
        row["dclean"].append(abs(b["clean_loss"] - a["clean_loss"]))
        row["same"] += (a["row_perm"], a["col_perm"]) == (b["row_perm"], b["col_perm"])
        compile_seconds = lambda r: sum(  # noqa: E731
            (r.get("compiles") or {}).get(k, 0.0) for k in ("trace_seconds", "lower_seconds", "compile_seconds")
        )
        row["s_a"] += a["seconds"]
        row["s_b"] += b["seconds"]
        row.setdefault("c_a", 0.0)
        row.setdefault("c_b", 0.0)
        row["c_a"] += compile_seconds(a)
        row["c_b"] += compile_seconds(b)
    return [
        {
            "attack": row["attack"],
            "pairs": row["pairs"],
            "mean_abs_dloss": float(np.mean(row["dloss"])),
            "max_abs_dloss": float(np.max(row["dloss"])),
            "mean_abs_dclean": float(np.mean(row["dclean"])),
            "same_order": f"{row['same']}/{row['pairs']}",
            "attack_s_ratio": row["s_b"] / row["s_a"] if row["s_a"] else float("nan"),
            "compile_s_a": row["c_a"],
            "compile_s_b": row["c_b"],
        }
        for row in rows.values()
    ]


# --------------------------------------------------------------------------- aggregation


def metric_value(record: dict, metric: str) -> float | None:
    """The record's value of ``metric`` (a score, or ``answer_loss``); None when it was not measured."""
    if "skipped" in record:
        return None
    if metric == LOSS_METRIC:
        return record.get(LOSS_METRIC)
    return (record.get("scores") or {}).get(metric)


def available_metrics(records: Iterable[dict]) -> list[str]:
    """Metrics with at least one value in ``records``: recorded scores (sorted), then ``answer_loss``."""
    records = list(records)
    scores = sorted(
        {m for r in records if "skipped" not in r for m, v in (r.get("scores") or {}).items() if _is_score(v)}
    )
    loss = [LOSS_METRIC] if any(metric_value(r, LOSS_METRIC) is not None for r in records) else []
    return scores + loss


def pick_metric(available: list[str], requested: str | None, where: str, hint: str, preference) -> str:
    """``requested`` if it is in ``available`` (else an error naming ``where`` and ``hint``); by default the
    first of ``preference`` that is available."""
    if requested is not None:
        if requested not in available:
            raise ValueError(
                f"metric {requested!r} is not recorded in {where}; available: {', '.join(available) or 'none'} ({hint})"
            )
        return requested
    chosen = next((metric for metric in preference if metric in available), None)
    if chosen is None:
        raise ValueError(f"no metric recorded in {where} ({hint})")
    return chosen


def choose_metric(records: Iterable[dict], requested: str | None = None, where: str = "the records") -> str:
    """``requested`` when recorded; by default the first of ``SCORE_METRICS`` recorded, else ``answer_loss``."""
    available = available_metrics(records)
    hint = "runs with --nogenerate have no scores" if available else "every record was skipped"
    return pick_metric(available, requested, where, hint, (*SCORE_METRICS, LOSS_METRIC))


def forward_cost(record: dict, backward_cost: float) -> float:
    """One record's compute in forwards: queries + ``backward_cost`` × backward calls (a backward's cost in
    forwards is measured by ``atp-benchmark``: ``fwd_bwd / fwd − 1``)."""
    return record["queries"] + backward_cost * record.get("backward_calls", 0)


def forward_equivalents(records: Iterable[dict], backward_cost: float = 2.0) -> dict[str, float]:
    """Mean cost per example of each recorded attack in forwards (``forward_cost``)."""
    costs: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if "queries" in r and "skipped" not in r:
            costs[r["attack"]].append(forward_cost(r, backward_cost))
    return {attack: float(np.mean(c)) for attack, c in costs.items()}


def equal_budget_pairs(records: Iterable[dict], backward_cost: float = 2.0) -> list[tuple[str, str]]:
    """(attack, ``best_of_k@k=K``): every searching attack against the recorded best-of-k whose k is the
    smallest at or above the attack's mean forward-equivalents — best-of-k is never given less compute."""
    budgets = forward_equivalents(records, backward_cost)
    best_of: dict[int, str] = {}
    searching = []
    for attack in budgets:
        config = attack_config(attack)
        if config is None:
            continue
        if config.method == "best_of_k":
            best_of.setdefault(config.k, attack)
        elif registry.method_of(config).searches and getattr(config, "direction", "gradient") == "gradient":
            searching.append(attack)
    pairs = []
    for attack in searching:
        enough = [k for k in best_of if k >= budgets[attack] - 1e-9]
        if enough:
            pairs.append((attack, best_of[min(enough)]))
    return pairs


def paired_comparisons(
    records: Iterable[dict],
    pairs=None,
    metric: str = LOSS_METRIC,
    resamples: int = 2000,
    seed: int = 0,
    backward_cost: float = 2.0,
) -> list[dict]:
    """For each ``(attack, other)`` recorded on common examples: the mean per-example difference of
    ``metric`` (attack − other) with its 95% BCa bootstrap interval (NaN ends below three examples; see
    :mod:`atp_jax.stats`), and ``higher``: on how many of the ``examples`` it is higher (a count).
    The paired difference is the right test for a control: examples vary far more than attacks do.

    ``pairs`` defaults to ``presets.control_pairs`` of the recorded attacks — each gradient method against
    its reversed / random-direction controls and against best-of-k, and evolution against best-of-k — and
    ``equal_budget_pairs`` (every searching attack against best-of-k at its compute, ``backward_cost``
    forwards per backward)."""
    records = list(records)
    if pairs is None:
        pairs = control_pairs(r["attack"] for r in records)
        pairs += [p for p in equal_budget_pairs(records, backward_cost) if p not in pairs]
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        if (v := metric_value(r, metric)) is not None:
            values[r["attack"]][r["id"]] = v
    rows = []
    for attack, other in pairs:
        common = sorted(set(values.get(attack, {})) & set(values.get(other, {})))
        if not common:
            continue
        diff = np.array([values[attack][i] - values[other][i] for i in common])
        low, high = bootstrap_interval(diff, resamples=resamples, seed=seed)
        rows.append(
            {
                "attack": attack,
                "against": other,
                "examples": len(common),
                "mean_difference": float(diff.mean()),
                "ci_low": low,
                "ci_high": high,
                "higher": int((diff > 0).sum()),
            }
        )
    return rows


def comparison_markdown(rows: list[dict], metric: str = LOSS_METRIC) -> str:
    """Paired comparisons as markdown: attack, against, n, mean difference [95% CI], higher on."""
    lines = [
        f"| attack | against | examples | mean {metric} difference [95% CI] | higher on |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['attack']} | {r['against']} | {r['examples']} | {r['mean_difference']:+.3f} "
        f"{interval_text(r['ci_low'], r['ci_high'])} | {r['higher']}/{r['examples']} |"
        for r in rows
    ]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Cell:
    """Mean of a metric over the examples of one (model, attack), with its BCa bootstrap interval (None: not
    asked for; NaN: undefined, fewer than three examples)."""

    mean: float
    n: int
    low: float | None = None
    high: float | None = None


@dataclasses.dataclass(frozen=True)
class ScoreTable:
    """One dataset's table: rows are models, columns attacks (ids, the paper's first: ``paper_order``), cells
    the mean ``metric``."""

    dataset: str
    metric: str
    models: list[str]
    attacks: list[str]
    cells: dict[tuple[str, str], Cell]
    ci_level: float | None = None


def _row_labels(runs: list[Run]) -> list[str]:
    """Each run's row: its model; where runs name one model but recorded different weights (``model_sha256``:
    say, fine-tunes each exported as ``model``), the name of the first folder holding those weights added (or
    the hash's first 12 digits where those folders share a name), so that different models never share a row;
    the prompt style added where one model ran in several styles on the same dataset (e.g. a transfer across
    styles), so those rows stay apart."""

    def style(run):
        s = run.manifest.get("style") or {}
        return f"{s.get('linearization', '?')}/{s.get('reasoning', '?')}"

    def weights(run):
        return run.manifest.get("model_sha256")  # runs without it keep sharing their model's row

    tags = defaultdict(dict)  # model name -> weights' sha256 -> the first folder's name that recorded them
    for run in runs:
        if weights(run):
            tags[run.model].setdefault(weights(run), run.folder.name)
    for model, by_weights in tags.items():
        if len(set(by_weights.values())) < len(by_weights):  # folders of one name (say, */eval): the hashes
            tags[model] = {sha: sha[:12] for sha in by_weights}
    tagged = [tags[run.model].get(weights(run)) if len(tags[run.model]) > 1 else None for run in runs]
    models = [run.model if tag is None else f"{run.model} [{tag}]" for run, tag in zip(runs, tagged)]
    styles = defaultdict(set)
    for run, model in zip(runs, models):
        styles[(model, run.dataset)].add(style(run))
    return [
        model if len(styles[(model, run.dataset)]) == 1 else f"{model} ({style(run)})"
        for run, model in zip(runs, models)
    ]


def score_tables(
    runs: Iterable[Run],
    metric: str | None = None,
    ci: bool = False,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    paired: bool = False,
    attacks: Iterable[str] | None = None,
) -> list[ScoreTable]:
    """One table per dataset (in order of first appearance) over ``runs``.

    Runs of the same model (and style) on the same dataset fill one row; a pair (id, attack) recorded in
    several of them counts once, from the first run given. Columns are the paper's attacks in its order, then
    the others in order of first appearance. ``metric``: as ``choose_metric``, per dataset. ``ci``: add the
    BCa bootstrap interval (:func:`atp_jax.stats.bootstrap_interval`).
    ``paired``: average each row only over the examples measured for every attack of the table, so that
    a partial run compares its attacks on the same examples. ``attacks``: only these (a group name such as
    ``paper_table`` stands for its attacks; None: all recorded).
    """
    runs = list(runs)
    wanted = None if attacks is None else {a for name in attacks for a in ATTACK_GROUPS.get(name, (name,))}
    rows: dict[str, dict[str, list[dict]]] = defaultdict(dict)  # dataset -> row label -> records
    seen: dict[tuple[str, str], set] = defaultdict(set)
    for run, label in zip(runs, _row_labels(runs)):
        taken = seen[(run.dataset, label)]
        fresh = [
            r
            for r in run.records
            if (r["id"], column_key(r)) not in taken and (wanted is None or r["attack"] in wanted)
        ]
        taken.update((r["id"], column_key(r)) for r in fresh)
        rows[run.dataset].setdefault(label, []).extend(fresh)
    tables = []
    for dataset, by_model in rows.items():
        all_records = [r for recs in by_model.values() for r in recs]
        if not all_records:  # none of the wanted attacks ran on this dataset
            continue
        chosen = choose_metric(all_records, metric, where=f"the {dataset!r} results")
        attacks = paper_order(column_key(r) for r in all_records)
        cells = {}
        for model, records in by_model.items():
            if paired:
                measured = defaultdict(set)
                for r in records:
                    if metric_value(r, chosen) is not None:
                        measured[r["id"]].add(column_key(r))
                complete = {i for i, names in measured.items() if len(names) == len(attacks)}
                records = [r for r in records if r["id"] in complete]
            for attack in attacks:
                values = [v for r in records if column_key(r) == attack and (v := metric_value(r, chosen)) is not None]
                if not values:
                    continue
                low, high = bootstrap_interval(values, level, resamples, seed) if ci else (None, None)
                cells[(model, attack)] = Cell(statistics.fmean(values), len(values), low, high)
        tables.append(ScoreTable(dataset, chosen, list(by_model), attacks, cells, level if ci else None))
    return tables


# --------------------------------------------------------------------------- output


def _cell_text(cell: Cell | None, show_n: bool, plus_minus: str = "±") -> str:
    if cell is None:
        return "–"
    text = f"{cell.mean:.3f}"
    if cell.low is not None:
        half = f"{(cell.high - cell.low) / 2:.3f}" if has_interval(cell.low, cell.high) else "n/a"
        text += f" {plus_minus} {half}"
    return text + (f" (n={cell.n})" if show_n else "")


def _title(t: ScoreTable, interval: str) -> tuple[str, bool]:
    """``dataset: mean metric [± half the interval] [(N examples per cell)]`` and whether cells need their n."""
    counts = {c.n for c in t.cells.values()}
    title = f"{t.dataset}: mean {t.metric}"
    if t.ci_level is not None:
        title += f" {interval} half the {t.ci_level:.0%} BCa bootstrap interval"
        if min(counts, default=MIN_VALUES) < MIN_VALUES:
            title += f" (n/a below {MIN_VALUES} examples)"
    if len(counts) == 1:
        n = next(iter(counts))
        title += f" ({n} example{'s' if n != 1 else ''} per cell)"
    return title, len(counts) > 1


def score_markdown(tables: list[ScoreTable]) -> str:
    """Each table as a markdown section: models as rows, attacks as the paper's columns (``column_name``), the
    mean per cell, ``± half the BCa interval`` with ``ci`` (the CSV has the interval's ends), and ``(n=…)`` in
    the cells when the example counts differ."""
    sections = []
    for t in tables:
        title, show_n = _title(t, "±")
        lines = [
            f"### {title}",
            "",
            "| model | " + " | ".join(map(column_name, t.attacks)) + " |",
            "|---|" + "---|" * len(t.attacks),
        ]
        for model in t.models:
            lines.append(
                f"| {model} | " + " | ".join(_cell_text(t.cells.get((model, a)), show_n) for a in t.attacks) + " |"
            )
        sections.append("\n".join(lines))
    return "\n\n".join(sections) if sections else "(no records)"


def score_csv(tables: list[ScoreTable]) -> str:
    """The tables as one CSV: a row per (dataset, model); per attack (the paper's column name) its mean, ``n``
    and, with ``ci``, ``ci_low``/``ci_high`` (empty where undefined). Columns are the union of the attacks; an
    unmeasured cell is empty."""
    attacks = paper_order(a for t in tables for a in t.attacks)
    with_ci = any(t.ci_level is not None for t in tables)
    header = ["dataset", "metric", "model"]
    for a in map(column_name, attacks):
        header += [a, f"{a} n"] + ([f"{a} ci_low", f"{a} ci_high"] if with_ci else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for t in tables:
        for model in t.models:
            row = [t.dataset, t.metric, model]
            for a in attacks:
                cell = t.cells.get((model, a))
                if cell is None:
                    row += [""] * (4 if with_ci else 2)
                    continue
                row += [repr(cell.mean), cell.n]
                if with_ci:
                    defined = has_interval(cell.low, cell.high)
                    row += [repr(cell.low), repr(cell.high)] if defined else ["", ""]
            writer.writerow(row)
    return buffer.getvalue()


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped, for a table cell or caption."""
    return "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))


def score_latex(tables: list[ScoreTable]) -> str:
    r"""Each table as a LaTeX ``table`` with a booktabs ``tabular`` (``\usepackage{booktabs}``): models as rows,
    the paper's column names, the mean per cell with ``$\pm$`` half the BCa interval with ``ci``, ``(n=…)``
    when the example counts differ; the caption names the dataset, metric, interval and example count."""
    sections = []
    plus_minus = r"$\pm$"
    for t in tables:
        title, show_n = _title(t, "±")
        caption = latex_escape(title).replace("±", plus_minus)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{t.dataset}-{t.metric}")
        lines = [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{caption}}}",
            rf"\label{{tab:{slug}}}",
            r"\begin{tabular}{l" + "r" * len(t.attacks) + "}",
            r"\toprule",
            " & ".join(["Model", *(latex_escape(column_name(a)) for a in t.attacks)]) + r" \\",
            r"\midrule",
        ]
        for model in t.models:
            cells = [_cell_text(t.cells.get((model, a)), show_n, plus_minus).replace("–", "--") for a in t.attacks]
            lines.append(" & ".join([latex_escape(model), *cells]) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def plot_scores(tables: list[ScoreTable], path: str | os.PathLike) -> list[os.PathLike]:
    """Bar chart, a panel per dataset: the paper's attack columns along x, a bar per model, the mean metric on
    y with BCa interval whiskers (with ``ci``), the examples per bar in each panel's title. Written as PDF and PNG
    (``path`` with each suffix); returns both paths."""
    if not tables:
        raise ValueError("plot_scores: no tables to plot")
    widest = max(len(t.attacks) * max(len(t.models), 1) for t in tables)
    figure = new_figure(max(4.5, 0.35 * widest + 2.5) * len(tables), 4.2)
    axes = figure.subplots(1, len(tables), squeeze=False)[0]
    for ax, t in zip(axes, tables):
        x = np.arange(len(t.attacks))
        width = 0.8 / max(len(t.models), 1)
        for k, model in enumerate(t.models):
            cells = [t.cells.get((model, a)) for a in t.attacks]
            means = [c.mean if c else np.nan for c in cells]
            err = None
            if t.ci_level is not None:
                err = np.array(
                    [[c.mean - c.low, c.high - c.mean] if c and has_interval(c.low, c.high) else [0, 0] for c in cells]
                ).T
            ax.bar(x + (k - (len(t.models) - 1) / 2) * width, means, width, yerr=err, capsize=2, label=model)
        ax.set_xticks(x, [column_name(a) for a in t.attacks], rotation=30, ha="right")
        ax.set_xlabel("attack")
        whiskers = f"\n(whiskers: {t.ci_level:.0%} BCa bootstrap interval)" if t.ci_level else ""
        ax.set_ylabel(f"mean {t.metric}{whiskers}")
        counts = sorted({c.n for c in t.cells.values()})
        n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
        ax.set_title(f"{t.dataset}: {n} examples per bar")
    # One legend under the panels: it never covers a bar or whisker.
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(len(labels), 3),
        fontsize="small",
    )
    return save_figure(figure, path)
