"""Attention diagnostics, original vs adversarial order (paper appendix A.4, Table 3, Figures 4-5).

  atp-diagnose --num_examples 20 --attack best_of_k --output_dir results/diagnose
  atp-diagnose --results results/qwen --attack evolution --output_dir results/diagnose

For every example the model reads the prompt plus the reference answer twice: in the table's original
order and in the order an attack chose, taken from a results folder (``--results``, the record of
``--attack``) or, for examples it lacks, found by running ``--attack`` here. Writes:

- ``pairs.jsonl``: per example, both diagnoses (per-layer cell attention in the table's own coordinates,
  row-boundary and within-row attention, evidence cells) and both reference-answer losses; appended
  atomically, and a rerun skips the examples already there; ``run.json`` and ``flags.txt`` as for
  run_attack.py (a rerun with another model, dataset, attack or order source is refused; ``--restart``).
- ``summary.md`` / ``summary.json``: the Table-3-like averages; ``layers.pdf``/``.png``: per-layer curves
  with 95% BCa bands (Figure 5); ``heatmap_<id>.pdf``/``.png`` for the first ``--heatmaps`` examples
  (Figure 4). A rerun with every example recorded redraws these from ``pairs.jsonl`` without the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import flags
from tqdm import tqdm

import atp_jax
from atp_jax.attack.presets import PRESETS, preset
from atp_jax.attack.problem import AttackInputError
from atp_jax.cli import model_flags, selection
from atp_jax.cli.console import run_app
from atp_jax.diagnostics.attention import diagnose
from atp_jax.diagnostics.summary import diagnosis_json, plot_heatmaps, plot_layers, summarize_pairs, summary_markdown
from atp_jax.inference.qa import answer_losses
from atp_jax.models.loading import DEFAULT_MODEL
from atp_jax.runs.experiment import environment
from atp_jax.runs.fingerprints import dataset_fingerprint, model_fingerprint
from atp_jax.runs.folders import load_run
from atp_jax.runs.manifest import ManifestMismatch, ResultsFolder, provenance
from atp_jax.runs.records import read_records
from atp_jax.tables.layout import build_layout
from atp_jax.tables.prompt import PromptStyle

selection.define_flags(num_examples=20, sharding=False)
selection.define_run_flags(model=DEFAULT_MODEL, output_dir="results/diagnose", memory_budget=False)
flags.DEFINE_string("results", None, "A results folder whose --attack orders are diagnosed (others: run here).")
flags.DEFINE_string("attack", "best_of_k", f"The attack whose order is the adversarial one: {', '.join(PRESETS)}.")
flags.DEFINE_integer("heatmaps", 4, "Draw heatmaps for this many examples.")
flags.DEFINE_integer("seed", 0, "Seed of the attack run here.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.attack not in PRESETS:
        sys.exit(f"unknown --attack {FLAGS.attack!r}; known: {', '.join(PRESETS)}")
    recorded = {}
    if FLAGS.results:
        try:
            run = load_run(FLAGS.results)
        except (FileNotFoundError, ValueError) as e:
            sys.exit(str(e))
        recorded = {r["id"]: r for r in run.records if r["attack"] == FLAGS.attack and "skipped" not in r}
        if not recorded:
            sys.exit(f"no {FLAGS.attack!r} records in {FLAGS.results}; pass an --attack it ran")
    examples = selection.examples()
    if not examples:
        sys.exit(f"--dataset {FLAGS.dataset}: no examples selected; loosen the selection")
    style = PromptStyle()
    config = preset(FLAGS.attack, seed=FLAGS.seed)
    out = selection.writable_folder(Path(FLAGS.output_dir))
    folder = ResultsFolder(out, records="pairs")
    try:
        identity = {
            **model_fingerprint(FLAGS.model),
            **model_flags.identity(),
            **dataset_fingerprint(FLAGS.dataset, FLAGS.split, FLAGS.data_dir),
            "style": style.as_dict(),
            "attack": FLAGS.attack,
            "orders_from": FLAGS.results,
            "seed": FLAGS.seed,
        }
        folder.begin(
            identity,
            {FLAGS.attack: config.as_dict()},
            provenance(sys.argv),
            flags_text=FLAGS.flags_into_string(),
            restart=FLAGS.restart,
            extra={
                "examples": len(examples),
                "selection": selection.manifest(),
                **model_flags.manifest(model_flags.check_model_flags()),
                **environment(),
            },
        )
    except (ManifestMismatch, ValueError) as e:
        sys.exit(str(e))
    pairs_path = folder.results_file
    done = {r["id"] for r in read_records(pairs_path)}
    todo = [e for e in examples if e.id not in done]
    model_name = identity["model"]
    if todo:  # with every example recorded, a rerun only redraws the summary and figures: no model needed
        model = model_flags.load_model_from_flags()
        model_name = model.name
    for example in tqdm(todo, desc="diagnosing"):
        if example.id in recorded:
            row_perm, col_perm = recorded[example.id]["row_perm"], recorded[example.id]["col_perm"]
            source = f"results:{FLAGS.results}"
        else:
            try:
                result = atp_jax.attack(model, example, config, style, name=FLAGS.attack)
            except AttackInputError as e:
                folder.append({"id": example.id, "attack": FLAGS.attack, "skipped": str(e)})
                continue
            row_perm, col_perm, source = result.row_perm, result.col_perm, "run here"
        try:
            layout = build_layout(model.tokenizer, example, style=style)
            clean = diagnose(model, example, style=style, layout=layout)
            permuted = diagnose(model, example, row_perm, col_perm, style, layout)
        except ValueError as e:
            folder.append({"id": example.id, "attack": FLAGS.attack, "skipped": str(e)})
            continue
        clean_loss, permuted_loss = answer_losses(
            model, example, [example.table, example.table.permute(row_perm, col_perm)]
        )
        folder.append(
            {
                "id": example.id,
                "attack": FLAGS.attack,
                "order_from": source,
                "clean": diagnosis_json(clean),
                "permuted": diagnosis_json(permuted),
                "clean_loss": float(clean_loss),
                "permuted_loss": float(permuted_loss),
            },
        )

    pairs = [r for r in read_records(pairs_path) if "skipped" not in r]
    skipped = [r for r in read_records(pairs_path) if "skipped" in r]
    if not pairs:
        sys.exit(f"no example could be diagnosed ({len(skipped)} skipped); see {pairs_path}")
    summary = summarize_pairs(pairs)
    summary.update(model=model_name, attack=FLAGS.attack, skipped=len(skipped))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    text = (
        f"Model {model_name}, adversarial order: {FLAGS.attack}, {len(pairs)} examples "
        f"({len(skipped)} skipped).\n\n" + summary_markdown(summary)
    )
    (out / "summary.md").write_text(text)
    plot_layers(pairs, out / "layers", title=f"{model_name}: original vs {FLAGS.attack} order")
    by_id = {e.id: e for e in examples}
    for pair in pairs[: FLAGS.heatmaps]:
        if pair["id"] in by_id:
            path = out / f"heatmap_{pair['id']}"
            plot_heatmaps(pair, by_id[pair["id"]].table.cells, summary["middle_layer"], path)
    print(text)


def run() -> None:
    """The console script ``atp-diagnose``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
