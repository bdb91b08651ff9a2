"""Does the gradient know which swaps hurt? Spearman correlation between the first-order prediction and the
true objective change of every single row/column swap at the original order, per example.

  atp-swap-correlation --model smollm2-135m-instruct --num_examples 12 \
      --output_dir results/swap_rank/smollm2-135m-instruct
  atp-swap-correlation --compare results/swap_rank/a,results/swap_rank/b \
      --attack_results results/a,results/b

Each example's figures are one record (``attack`` = ``swap_rank``) in ``OUTPUT_DIR/results.jsonl``,
appended atomically; a rerun skips the examples already there, and a rerun with another model, dataset
or prompt style is refused (``--restart`` sets the old records aside). ``--compare`` prints one table
over several such folders (one per model): the median and range of Spearman ρ, how often the swap the
gradient ranks first raises the loss, and — from ``--attack_results``, results folders of run_attack.py
on the same questions, one per compared folder — the distinct hard orders each ATP run visited.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from absl import flags
from tqdm import tqdm

from atp_jax.attack.problem import AttackInputError, make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.search import swap_rank_correlation
from atp_jax.cli import selection
from atp_jax.cli.console import run_app
from atp_jax.cli.model_flags import load_model_from_flags
from atp_jax.inference.qa import InputTooLong
from atp_jax.runs.folders import load_run
from atp_jax.runs.records import read_records
from atp_jax.stats import bootstrap_interval, has_interval
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle

RECORD_NAME = "swap_rank"  # the ``attack`` field of every record this binary writes

selection.define_flags(num_examples=12, max_rows=12, max_cols=8, sharding=False)
selection.define_run_flags(model="smollm2-135m-instruct", output_dir="results/swap_rank", memory_budget=False)
selection.define_bucket_flags()
flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
flags.DEFINE_list("compare", [], "Print the comparison table of these swap-rank folders instead of running.")
flags.DEFINE_list(
    "attack_results",
    [],
    "With --compare: run_attack.py folders (same order as --compare, '-' for none) whose ATP records give "
    "the distinct orders visited.",
)
flags.DEFINE_list("atp_attacks", ["paper", "atp_joint"], "With --compare: the ATP specs whose visits are counted.")
flags.DEFINE_bool(
    "decompose",
    False,
    "Also split each swap's change into its content part (every run of the prompt kept at its original position "
    "ids) and its position-shift part (the rest): twice the forwards.",
)
flags.DEFINE_bool(
    "soft_positions",
    False,
    "Also rank the swaps by the gradient of the relaxation whose RoPE positions follow the soft orders "
    "(ATPConfig.positions='soft'): one more backward per question.",
)
flags.DEFINE_bool(
    "fixed_slots",
    False,
    "Also lay the table out in fixed slots (every cell slot as long as the longest cell, so a reorder shifts no "
    "position): its losses against the real prompt's, and its relaxation's swap ranking; twice the forwards and "
    "one more backward.",
)
flags.DEFINE_integer(
    "smooth_samples",
    0,
    "Also rank the swaps by the gradient averaged over this many soft orders near the original "
    "((1 - s) P + s Q, Q random; s = --smooth_scale): that many more backwards per question.",
)
flags.DEFINE_float("smooth_scale", 0.25, "With --smooth_samples: how far towards the random orders, in (0, 1].")
flags.DEFINE_integer("seed", 0, "With --smooth_samples: seed of the random orders.")
FLAGS = flags.FLAGS


def _fraction(values) -> str:
    values = list(values)
    return f"{sum(values)}/{len(values)}" if values else "–"


def compare_table(folders: list[str], attack_folders: list[str], atp_attacks: list[str]) -> str:
    """Markdown: one row per swap-rank folder (model), over the example ids every folder recorded."""
    runs = []
    for folder in folders:
        run = load_run(folder)
        runs.append((run.manifest.get("model", folder), {r["id"]: r for r in run.records if "skipped" not in r}))
    common = set.intersection(*(set(by_id) for _, by_id in runs)) if runs else set()
    header = (
        "| model | examples | median ρ | ρ range | mean ρ − first row's (95% CI) | top-ranked swap raises loss | "
        "median best true gain | " + " | ".join(f"distinct orders, {a} (median, n)" for a in atp_attacks) + " |"
    )
    lines = [header, "|" + "---|" * (7 + len(atp_attacks))]
    first = None
    for i, (model, by_id) in enumerate(runs):
        rows = [by_id[k] for k in sorted(common)]
        rho = [r["spearman"] for r in rows]
        first = rho if first is None else first
        shift = "–"
        if i:
            differences = np.asarray(rho) - np.asarray(first)  # paired: the same questions
            low, high = bootstrap_interval(differences)
            interval = f"({low:+.3f} … {high:+.3f})" if has_interval(low, high) else "(n/a)"
            shift = f"{differences.mean():+.3f} {interval}"
        visits = []
        attack_folder = attack_folders[i] if i < len(attack_folders) else "-"
        for spec in atp_attacks:
            if attack_folder == "-":
                visits.append("–")
                continue
            counts = [
                r["trace"]["distinct_orders_visited"]
                for r in load_run(attack_folder).records
                if r["attack"] == spec and r["id"] in common and "distinct_orders_visited" in (r.get("trace") or {})
            ]
            visits.append(f"{statistics.median(counts):g} (n={len(counts)})" if counts else "–")
        lines.append(
            f"| {model} | {len(rows)} | {statistics.median(rho):.3f} | {min(rho):.3f} … {max(rho):.3f} | {shift} | "
            f"{_fraction(r['gain_of_top_predicted_swap'] > 0 for r in rows)} | "
            f"{statistics.median(r['best_true_gain'] for r in rows):.3f} | " + " | ".join(visits) + " |"
        )
    return "\n".join(lines)


def decomposition_table(rows: list[dict]) -> str:
    """Markdown, one row per example and a median row: how much of the swaps' effect is position shift, and
    whether the gradient ranks the content part better than the whole change."""
    columns = {
        "mean_abs_change": "mean \\|Δ\\|",
        "mean_abs_content": "mean \\|content\\|",
        "mean_abs_shift": "mean \\|shift\\|",
        "shift_share": "shift share",
        "spearman_change_content": "ρ(Δ, content)",
        "spearman": "ρ(predicted, Δ)",
        "spearman_predicted_content": "ρ(predicted, content)",
        "spearman_soft_positions": "ρ(predicted with soft positions, Δ)",
        "fixed_slot_loss_gap": "fixed-slot loss − real",
        "fixed_slot_mean_abs_gap": "mean \\|fixed-slot − real\\| over swaps",
        "spearman_fixed_slot_change": "ρ(fixed-slot Δ, Δ)",
        "spearman_fixed_slot_predicted": "ρ(fixed-slot predicted, fixed-slot Δ)",
        "spearman_fixed_slot_predicted_true": "ρ(fixed-slot predicted, Δ)",
        "spearman_smoothed": "ρ(smoothed predicted, Δ)",
        "gain_of_top_predicted_swap": "gain of top swap",
        "gain_of_top_predicted_swap_soft_positions": "gain of top swap, soft positions",
        "gain_of_top_predicted_swap_fixed_slots": "gain of top swap, fixed slots",
        "gain_of_top_predicted_swap_smoothed": "gain of top swap, smoothed",
    }
    keys = [k for k in columns if all(k in r for r in rows)]
    lines = ["| id | " + " | ".join(columns[k] for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for r in rows:
        lines.append(f"| {r['id']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")
    lines.append("| **median** | " + " | ".join(f"{statistics.median(r[k] for r in rows):.3f}" for k in keys) + " |")
    return "\n".join(lines)


def main(argv):
    del argv
    if FLAGS.compare:
        try:
            print(compare_table(FLAGS.compare, FLAGS.attack_results, FLAGS.atp_attacks))
        except (FileNotFoundError, ValueError) as e:
            sys.exit(str(e))
        return
    examples = selection.examples()
    if not examples:
        sys.exit(f"--dataset {FLAGS.dataset}: no examples selected; loosen the selection")
    style = PromptStyle(linearization=FLAGS.style)
    config = {"style": style.as_dict(), "diagnostic": "single-swap rank correlation at the original order"}
    # Keys only when set, so that folders recorded without them still resume.
    if FLAGS.decompose:
        config["decomposition"] = "content (original position ids kept) and position shift of every swap"
    if FLAGS.soft_positions:
        config["soft_positions"] = "also the prediction of the relaxation with soft positions"
    if FLAGS.fixed_slots:
        config["fixed_slots"] = "also the fixed-slot layout's losses and its relaxation's prediction"
    if FLAGS.smooth_samples:
        if not 0 < FLAGS.smooth_scale <= 1:
            sys.exit(f"--smooth_scale {FLAGS.smooth_scale}: give a fraction in (0, 1]")
        config["smoothed"] = {"samples": FLAGS.smooth_samples, "scale": FLAGS.smooth_scale, "seed": FLAGS.seed}
    folder = selection.open_folder(
        config,
        {RECORD_NAME: {"method": RECORD_NAME, "at": "original order", "moves": "every single row and column swap"}},
        len(examples),
    )
    done = {key[0] for key in folder.done_keys() if key[1] == RECORD_NAME}
    todo = [ex for ex in examples if ex.id not in done]
    print(f"{len(examples)} examples: {len(done & {ex.id for ex in examples})} recorded, {len(todo)} to run")
    if todo:
        model = load_model_from_flags()
        for example in tqdm(todo, desc="swaps"):
            start = time.perf_counter()
            try:
                evaluator = Evaluator(model, make_problem(model, example, style, buckets=selection.bucket_grid()))
                stats = swap_rank_correlation(
                    evaluator,
                    decompose=FLAGS.decompose,
                    soft_positions=FLAGS.soft_positions,
                    fixed_slots=FLAGS.fixed_slots,
                    smooth_samples=FLAGS.smooth_samples,
                    smooth_scale=FLAGS.smooth_scale,
                    seed=FLAGS.seed,
                )
            except (AttackInputError, InputTooLong) as e:
                folder.append({"id": example.id, "attack": RECORD_NAME, "skipped": str(e)})
                continue
            folder.append(
                {
                    "id": example.id,
                    "attack": RECORD_NAME,
                    **stats,
                    "queries": evaluator.queries,
                    "seconds": time.perf_counter() - start,
                }
            )
    rows = [r for r in read_records(folder.results_file) if "skipped" not in r]
    print("| id | swaps | spearman | gain of top-predicted swap | best true gain | mean true gain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['id']} | {r['swaps']} | {r['spearman']:.3f} | {r['gain_of_top_predicted_swap']:.3f} | "
            f"{r['best_true_gain']:.3f} | {r['mean_true_gain']:.3f} |"
        )
    extra = ("shift_share", "spearman_soft_positions", "spearman_fixed_slot_change", "spearman_smoothed")
    if rows and any(key in rows[0] for key in extra):
        print()
        print(decomposition_table(rows))
    if rows:
        print(json.dumps({"median_spearman": statistics.median(r["spearman"] for r in rows), "examples": len(rows)}))


def run() -> None:
    """The console script ``atp-swap-correlation``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
