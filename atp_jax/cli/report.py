"""The paper's results table over one or more results folders: models x attacks, per dataset.

  atp-report --results results/smollm,results/qwen --output results/table

Each folder's ``results.jsonl`` and ``results.shard*.jsonl`` are merged (a pair (id, attack) recorded
twice counts once, the first time); its ``run.json`` names the model (the row) and the dataset (the
table). Columns are the paper's (Vanilla | Rand | Best 20 | Row Rvs | Col Rvs | E-Search | ATP Row | ATP Col |
ATP Row&Col, for the presets of the ``paper_table`` group), then any other attack under its id. Cells are the
mean ``--metric`` over examples (default: accuracy, em or rougeL_recall, the first recorded; answer_loss for
runs without generation) with a 95% BCa bootstrap interval (``--noci`` leaves it out); ``--paired`` averages
each row over only the examples measured for every attack (partial runs). Prints the markdown; with
``--output PREFIX`` also writes PREFIX.md, PREFIX.csv, PREFIX.tex (booktabs) and the bar chart PREFIX.pdf and
PREFIX.png. A folder whose records carry ``defended`` (atp-attack --smoothing_k) adds a section to the
markdown: per attack, the undefended mean score and the mean under permutation smoothing with each k.
``--summary`` adds, per folder and attack, the mean loss, model calls, seconds, and ``broken``: how many of the
answers right under the original order the attack made wrong.

``--probe_filter`` with two folders of the same best-of-k on the same questions (a cheap model's first) reads
their shared random orders (``atp_jax.runs.probe_filter``): how well the models' order effects agree, and what
the cheap model gains as a filter over the expensive model's best-of-k at the same compute.

``--compare --sampled_reference best_of_k@k=K`` also sets every searching attack against best-of-j at its own
compute on each question, exact in expectation over the K order losses one best-of-K run recorded
(``atp_jax.runs.sampled_budget``); ``--backward_cost`` takes one value or one per folder. With
``--choose_strongest`` it picks the attack that beats it by the most on its worst folder, on a random half of the
questions, and measures that attack alone on the other half (``atp_jax.runs.strongest``).

``--robustness`` compares models evaluated with the same attacks on the same questions, one folder each, the base
model's first (``atp_jax.runs.robustness``): per model the original order's CE and accuracy and each attack's CE,
accuracy and gain (attack CE − vanilla CE per question), then each model against each of the first
``--robustness_references`` folders, paired by question with 95% BCa intervals.

  atp-report --results results/base,results/clean,results/adversarial --robustness --attacks best_of_k,strongest
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from atp_jax.cli.console import run_app
from atp_jax.runs.defense_report import defense_metrics, defense_table
from atp_jax.runs.folders import load_run
from atp_jax.runs.probe_filter import filter_rows, order_agreement, paired_order_losses
from atp_jax.runs.report import (
    LOSS_METRIC,
    agreement_rows,
    comparison_markdown,
    markdown_table,
    paired_comparisons,
    plot_scores,
    score_csv,
    score_latex,
    score_markdown,
    score_tables,
    summarize,
)
from atp_jax.runs.robustness import REFERENCES, robustness, robustness_markdown
from atp_jax.runs.sampled_budget import sampled_budget_markdown, sampled_budget_rows
from atp_jax.runs.strongest import choose_strongest, strongest_markdown

_RESULTS = flags.DEFINE_list("results", None, "Comma list of results folders (run_attack/ablate/transfer output).")
_METRIC = flags.DEFINE_string(
    "metric",
    None,
    "accuracy | em | f1 | rougeL_recall | answer_loss (default: the "
    "first recorded of accuracy, em, rougeL_recall, else answer_loss).",
)
_CI = flags.DEFINE_bool(
    "ci", True, "Give each mean its 95% BCa bootstrap interval (none below 3 examples); --noci leaves them out."
)
_PAIRED = flags.DEFINE_bool(
    "paired",
    False,
    "Average each model's row only over the examples measured for "
    "every attack (a fair comparison inside a partial run).",
)
_ATTACKS = flags.DEFINE_list(
    "attacks", None, "Only these attacks' columns (a group such as paper_table stands for its attacks); default: all."
)
_RESAMPLES = flags.DEFINE_integer("resamples", 2000, "Bootstrap resamples.")
_SEED = flags.DEFINE_integer("seed", 0, "Bootstrap seed.")
_COMPARE = flags.DEFINE_bool(
    "compare",
    False,
    "Also print paired comparisons of each gradient method with its "
    "reversed/random-direction controls, with best-of-20 and with the recorded best-of-k at each searching "
    "attack's compute (per-example differences).",
)
_BACKWARD_COST = flags.DEFINE_list(
    "backward_cost",
    ["2.0"],
    "With --sampled_reference (--compare, --choose_strongest): a backward pass's cost in forwards, for the "
    "best-of-k at equal compute each searching attack is compared with (measure it: atp-benchmark's fwd_bwd / "
    "fwd - 1); one value for every --results folder, or one per folder (victims differ).",
)
_SAMPLED_REFERENCE = flags.DEFINE_string(
    "sampled_reference",
    None,
    "With --compare: also compare every searching attack with best-of-j random orders at its own compute on each "
    "question (j = its forwards, a backward counted as --backward_cost), exact in expectation over this best-of-k "
    "spec's recorded order losses (e.g. best_of_k@k=54): one large best-of-k run stands in for one run per budget.",
)
_SUMMARY = flags.DEFINE_bool(
    "summary",
    False,
    "Per folder and attack: examples, mean loss, forwards, backwards, seconds, mean scores, how often it beats "
    "best_of_k, and the answers right in the original order that it broke (`broken`, atp_jax.runs.report.summarize).",
)
_CHOOSE_STRONGEST = flags.DEFINE_bool(
    "choose_strongest",
    False,
    "With --sampled_reference: choose the searching attack that beats best-of-j at its compute by the most on its "
    "worst --results folder, on a random half of the questions they share, and measure it alone on the other half "
    "(atp_jax.runs.strongest).",
)
_SPLIT_SEED = flags.DEFINE_integer("split_seed", 0, "With --choose_strongest: the seed that halves the questions.")
_AGREEMENT = flags.DEFINE_bool(
    "agreement",
    False,
    "With two --results folders of the same attacks and questions (float32 and --dtype bfloat16, or two code "
    "versions): print per attack how far the second's losses and chosen orders are from the first's, and its time "
    "over the first's.",
)
_PROBE_FILTER = flags.DEFINE_bool(
    "probe_filter",
    False,
    "With two --results folders of best_of_k on the same questions with the same seed, a cheap model's first: "
    "how well the two models' losses agree over the shared random orders, and what the cheap model gains as a "
    "filter (the expensive model scores only the cheap one's top j orders) over best-of-k random orders of the "
    "expensive model at the same compute.",
)
_PROBE_ATTACK = flags.DEFINE_string(
    "probe_attack", "best_of_k", "With --probe_filter: the best-of-k spec whose orders pair (e.g. best_of_k@k=54)."
)
_CHEAP_COST = flags.DEFINE_float(
    "cheap_cost",
    0.35,
    "With --probe_filter: a forward of the cheap model in forwards of the expensive one (measure it: the two "
    "models' atp-benchmark fwd times).",
)
_ROBUSTNESS = flags.DEFINE_bool(
    "robustness",
    False,
    "Compare the models of the --results folders (one each, the base model's first, all evaluated with vanilla "
    "and the same attacks on the same questions): per model the vanilla CE and --metric, each attack's CE, --metric "
    "and gain (attack CE - vanilla CE per question; --attacks chooses the attacks), then each model against the "
    "first --robustness_references folders, paired by question with 95% BCa intervals (atp_jax.runs.robustness).",
)
_ROBUSTNESS_REFERENCES = flags.DEFINE_integer(
    "robustness_references",
    REFERENCES,
    "With --robustness: every folder is compared with each of this many leading --results folders given before it "
    "(e.g. 2: the base model and a clean fine-tune).",
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "Prefix of the .md, .csv, .tex, .pdf and .png files to write (none: print only)."
)
flags.mark_flag_as_required("results")


def main(argv):
    del argv
    try:
        runs = [load_run(folder) for folder in _RESULTS.value]
        tables = score_tables(
            runs,
            _METRIC.value,
            _CI.value,
            resamples=_RESAMPLES.value,
            seed=_SEED.value,
            paired=_PAIRED.value,
            attacks=_ATTACKS.value,
        )
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"--results {','.join(_RESULTS.value)}: {e}")
    if not tables:
        sys.exit(f"--attacks {','.join(_ATTACKS.value or [])}: none of them is recorded in --results")
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
    if _SUMMARY.value:
        for run in runs:
            measured = [r for r in run.records if "skipped" not in r and "answer_loss" in r]
            if measured:
                title = f"### {run.dataset}: {run.model}, per attack ({run.folder})"
                sections.append(f"{title}\n\n" + markdown_table(summarize(measured)))
    backward_costs = _backward_costs(len(runs))
    if _COMPARE.value:
        metric = _METRIC.value or LOSS_METRIC
        for run, backward_cost in zip(runs, backward_costs):
            rows = paired_comparisons(
                run.records,
                metric=metric,
                resamples=_RESAMPLES.value,
                seed=_SEED.value,
                backward_cost=backward_cost,
            )
            if rows:
                sections.append(
                    f"### {run.dataset}: {run.model}, paired comparisons ({run.folder})\n\n"
                    + comparison_markdown(rows, metric)
                )
            if _SAMPLED_REFERENCE.value:
                sections.append(_sampled_budget_section(run, backward_cost))
    if _CHOOSE_STRONGEST.value:
        sections.append(_strongest_section(runs, backward_costs))
    if _AGREEMENT.value:
        if len(runs) != 2:
            sys.exit(f"--agreement compares two results folders; --results names {len(runs)}")
        rows = agreement_rows(runs[0].records, runs[1].records)
        if not rows:
            sys.exit(f"--agreement: {runs[0].folder} and {runs[1].folder} share no recorded (question, attack) pair")
        sections.append(f"### {runs[1].folder} against {runs[0].folder}\n\n" + markdown_table(rows))
    if _PROBE_FILTER.value:
        sections.append(_probe_filter_section(runs))
    if _ROBUSTNESS.value:
        sections.append(_robustness_section(runs))
    markdown = "\n\n".join(sections)
    print(markdown)
    if _OUTPUT.value:
        prefix = Path(_OUTPUT.value)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.md").write_text(markdown + "\n")
        Path(f"{prefix}.csv").write_text(score_csv(tables))
        Path(f"{prefix}.tex").write_text(score_latex(tables))
        figures = plot_scores(tables, prefix)
        print("wrote", ", ".join(map(str, [f"{prefix}.md", f"{prefix}.csv", f"{prefix}.tex", *figures])))


def _backward_costs(folders: int) -> list[float]:
    values = _BACKWARD_COST.value
    try:
        costs = [float(v) for v in values]
    except ValueError:
        sys.exit(f"--backward_cost {','.join(values)}: give numbers (forwards per backward), e.g. 1.66")
    if len(costs) == 1:
        return costs * folders
    if len(costs) != folders:
        sys.exit(f"--backward_cost gives {len(costs)} values for {folders} --results folders; give one, or one each")
    return costs


def _sampled_budget_section(run, backward_cost: float) -> str:
    reference = _SAMPLED_REFERENCE.value
    try:
        rows = sampled_budget_rows(run.records, reference, backward_cost, resamples=_RESAMPLES.value, seed=_SEED.value)
    except ValueError as e:
        sys.exit(f"--sampled_reference {reference} in {run.folder}: {e}")
    return (
        f"### {run.dataset}: {run.model}, against best-of-j at each question's compute, from {reference} "
        f"({run.folder}; a backward = {backward_cost:g} forwards)\n\n" + sampled_budget_markdown(rows, reference)
    )


def _strongest_section(runs, backward_costs: list[float]) -> str:
    reference = _SAMPLED_REFERENCE.value
    if not reference:
        sys.exit("--choose_strongest compares with best-of-j at equal compute: give --sampled_reference best_of_k@k=K")
    try:
        choice = choose_strongest(
            [run.records for run in runs],
            reference,
            backward_costs,
            split_seed=_SPLIT_SEED.value,
            resamples=_RESAMPLES.value,
            seed=_SEED.value,
        )
    except ValueError as e:
        sys.exit(f"--choose_strongest over {','.join(str(run.folder) for run in runs)}: {e}")
    return f"### The strongest attack against best-of-j at its compute, from {reference}\n\n" + strongest_markdown(
        choice, [f"{run.model} ({run.folder})" for run in runs]
    )


def _robustness_section(runs) -> str:
    try:
        result = robustness(
            runs,
            attacks=_ATTACKS.value,
            metric=_METRIC.value,
            references=_ROBUSTNESS_REFERENCES.value,
            resamples=_RESAMPLES.value,
            seed=_SEED.value,
        )
    except ValueError as e:
        sys.exit(f"--robustness: {e}")
    return f"### {runs[0].dataset}: robustness to table orders, {len(runs)} models\n\n" + robustness_markdown(result)


def _probe_filter_section(runs) -> str:
    if len(runs) != 2:
        sys.exit(f"--probe_filter takes two results folders, the cheap model's first; --results names {len(runs)}")
    cheap, expensive = runs
    if cheap.manifest.get("seed") != expensive.manifest.get("seed"):
        sys.exit(f"--probe_filter: {cheap.folder} and {expensive.folder} were run with different --seed")
    name = _PROBE_ATTACK.value
    specs = [(r.manifest.get("attacks") or {}).get(name) or {} for r in runs]
    drawn = [{key: spec.get(key) for key in ("method", "k", "mode", "seed")} for spec in specs]
    if drawn[0] != drawn[1] or drawn[0]["method"] != "best_of_k":
        sys.exit(
            f"--probe_filter: {name} must be a best_of_k spec that draws the same way in both folders "
            f"({drawn[0]} vs {drawn[1]})"
        )
    try:
        pairs = paired_order_losses(cheap.records, expensive.records, attack=name)
    except ValueError as e:
        sys.exit(f"--probe_filter {cheap.folder},{expensive.folder}: {e}")
    if not pairs:
        sys.exit(f"--probe_filter: {cheap.folder} and {expensive.folder} share no question with {name} recorded")
    agreement = order_agreement(pairs)
    rows = filter_rows(pairs, cheap_cost=_CHEAP_COST.value, resamples=_RESAMPLES.value, seed=_SEED.value)
    per_question = ", ".join(f"{i} {rho:+.2f}" for i, rho in agreement["per_question"].items())
    return (
        f"### {cheap.model} as a filter for {expensive.model}\n\n"
        f"Spearman of the two models' losses over the shared orders: median {agreement['median_spearman']:+.3f}, "
        f"positive on {agreement['positive']} questions ({per_question}).\n\n" + markdown_table(rows)
    )


def run() -> None:
    """The console script ``atp-report``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
