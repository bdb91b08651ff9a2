"""The paper-style results table over one or more results folders: models x attacks, per dataset.

  atp-report --results results/smollm,results/qwen --ci --output results/table

Each folder's ``results.jsonl`` and ``results.shard*.jsonl`` are merged (a pair (id, attack) recorded
twice counts once, the first time); its ``run.json`` names the model (the row) and the dataset (the
table). Cells are the mean ``--metric`` over examples (default: accuracy, em or rougeL_recall, the
first recorded; answer_loss for runs without generation), with ``--ci`` a 95% bootstrap interval;
``--paired`` averages each row over only the examples measured for every attack (partial runs).
Prints the markdown; with ``--output PREFIX`` also writes PREFIX.md, PREFIX.csv and PREFIX.png.
A folder whose records carry ``defended`` (run_attack.py --smoothing_k) adds a section to the markdown:
per attack, the undefended mean score and the mean under permutation smoothing with each k.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from atp_jax.cli.console import run_app
from atp_jax.runs.defense_report import defense_metrics, defense_table
from atp_jax.runs.folders import load_run
from atp_jax.runs.report import (
    LOSS_METRIC,
    comparison_markdown,
    paired_comparisons,
    plot_scores,
    score_csv,
    score_markdown,
    score_tables,
)

_RESULTS = flags.DEFINE_list("results", None, "Comma list of results folders (run_attack/ablate/transfer output).")
_METRIC = flags.DEFINE_string(
    "metric",
    None,
    "accuracy | em | f1 | rougeL_recall | answer_loss (default: the "
    "first recorded of accuracy, em, rougeL_recall, else answer_loss).",
)
_CI = flags.DEFINE_bool("ci", False, "Add a 95% percentile-bootstrap interval of each mean.")
_PAIRED = flags.DEFINE_bool(
    "paired",
    False,
    "Average each model's row only over the examples measured for "
    "every attack (a fair comparison inside a partial run).",
)
_RESAMPLES = flags.DEFINE_integer("resamples", 2000, "Bootstrap resamples.")
_SEED = flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
_COMPARE = flags.DEFINE_bool(
    "compare",
    False,
    "Also print paired comparisons of each gradient method with its "
    "reversed/random-direction controls and with best-of-20 (per-example differences).",
)
_OUTPUT = flags.DEFINE_string("output", None, "Prefix of the .md, .csv and .png files to write (none: print only).")
flags.mark_flag_as_required("results")


def main(argv):
    del argv
    runs = [load_run(folder) for folder in _RESULTS.value]
    tables = score_tables(
        runs, _METRIC.value, _CI.value, resamples=_RESAMPLES.value, seed=_SEED.value, paired=_PAIRED.value
    )
    sections = [score_markdown(tables)]
    for run in runs:
        defended = [r for r in run.records if "skipped" not in r and r.get("defended")]
        if defended:
            # Only scores are measured under the defense: --metric answer_loss falls back to the default score.
            metric = _METRIC.value if _METRIC.value in defense_metrics(defended) else None
            sections.append(
                f"### {run.dataset}: {run.model}, permutation smoothing ({run.folder})\n\n"
                + defense_table(defended, metric)
            )
    if _COMPARE.value:
        metric = _METRIC.value or LOSS_METRIC
        for run in runs:
            rows = paired_comparisons(run.records, metric=metric, resamples=_RESAMPLES.value, seed=_SEED.value)
            if rows:
                sections.append(
                    f"### {run.dataset}: {run.model}, paired comparisons ({run.folder})\n\n"
                    + comparison_markdown(rows, metric)
                )
    markdown = "\n\n".join(sections)
    print(markdown)
    if _OUTPUT.value:
        prefix = Path(_OUTPUT.value)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.md").write_text(markdown + "\n")
        Path(f"{prefix}.csv").write_text(score_csv(tables))
        plot_scores(tables, f"{prefix}.png")
        print(f"wrote {prefix}.md, {prefix}.csv, {prefix}.png")


def run() -> None:
    """The console script ``atp-report``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
