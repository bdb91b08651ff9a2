"""λ and N_attack sweeps of one ATP preset (the paper's Table 5 and Figure 6), a learning-rate sweep, and an
ablation of the engineering options (each changed alone at the same budget: ``--sweeps options``).

  atp-ablate --model smollm2-135m-instruct --attack paper --num_examples 12 \
      --output_dir results/ablation

For each swept value the preset runs with that override on the same examples (λ sets λ_r and λ_c;
N_attack the steps or search iterations), recorded under the point's canonical attack spec
(``paper@lambda_col=1.0,lambda_row=1.0``, ``paper@n_attack=40``; the preset's own value is ``paper``), a
valid ``--attacks`` entry, in the schema of run_attack.py: ``OUTPUT_DIR/lambda/results.jsonl`` and
``OUTPUT_DIR/n_attack/results.jsonl`` (``results.shardK.jsonl`` per process), each with its run.json,
resumed on rerun. Then prints value → mean loss / mean score and writes ``OUTPUT_DIR/ablation.md`` and
the line plot ``OUTPUT_DIR/ablation.pdf`` and ``.png``. ``report.py --results OUTPUT_DIR/lambda`` reads a sweep too.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from atp_jax.attack.presets import PRESETS, canonical, one_option_changes, preset
from atp_jax.cli import selection
from atp_jax.cli.console import run_app, tag_process, tagged
from atp_jax.cli.model_flags import load_model_from_flags
from atp_jax.distributed import maybe_initialize
from atp_jax.runs.ablation import option_rows, plot_sweeps, sweep_overrides, sweep_rows
from atp_jax.runs.folders import merge_records, results_files
from atp_jax.runs.loop import Job, pending, run_pending
from atp_jax.runs.report import markdown_table
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle

SWEEPS = ("lambda", "n_attack", "lr", "options")

selection.define_flags(num_examples=12)
selection.define_run_flags(model="smollm2-135m-instruct", output_dir="results/ablation", tracking=True)
selection.define_bucket_flags()
flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
flags.DEFINE_string("attack", "paper", "The preset swept (an ATP preset; N_attack also takes a search preset).")
flags.DEFINE_list(
    "sweeps",
    "lambda,n_attack",
    f"Which sweeps to run: {', '.join(SWEEPS)} (options: "
    "atp_jax.attack.presets.one_option_changes, each against the preset itself).",
)
flags.DEFINE_list("lambdas", "0,1,5,10,20", "λ values (λ_r = λ_c).")
flags.DEFINE_list("n_attacks", "5,10,20,40", "N_attack values.")
flags.DEFINE_list("lrs", "0.03,0.1,0.3,1,3", "Adam learning rates (the lr sweep; ATP presets only).")
flags.DEFINE_integer("seed", 0, "Seed of every attack.")
flags.DEFINE_integer("max_new_tokens", 32, "Generation budget for the answer under the chosen order.")
flags.DEFINE_bool("generate", True, "Generate and score the model's answer under each chosen order.")
FLAGS = flags.FLAGS


def _values(flag: str, cast) -> list:
    try:
        return [cast(v) for v in getattr(FLAGS, flag)]
    except ValueError:
        sys.exit(f"--{flag}={','.join(getattr(FLAGS, flag))}: give a comma list of numbers, e.g. --{flag}=0,1,5")


def _points(name: str, parameter: str, values: list) -> dict:
    """{canonical spec: config} of one sweep: every name recorded is a valid ``--attacks`` entry."""
    points = {}
    for value in values:
        overrides = sweep_overrides(parameter, value)
        points[canonical(name, **overrides)] = preset(name, seed=FLAGS.seed, **overrides)
    return points


def _sweep_configs() -> dict[str, dict]:
    """Sweep → {attack name: config}, after checking the preset can take the override."""
    name = FLAGS.attack
    if name not in PRESETS:
        sys.exit(f"unknown --attack {name!r}; known: {', '.join(PRESETS)}")
    unknown = [s for s in FLAGS.sweeps if s not in SWEEPS]
    if unknown:
        sys.exit(f"unknown sweep(s) {', '.join(unknown)}; choose from {', '.join(SWEEPS)}")
    method = PRESETS[name].method
    atp_presets = ", ".join(n for n, c in PRESETS.items() if c.method == "atp")
    sweeps = {}
    if "lambda" in FLAGS.sweeps:
        if method != "atp":
            sys.exit(
                f"--attack={name} is a {method!r} preset and has no λ; sweep λ on an ATP preset "
                f"({atp_presets}) or pass --sweeps=n_attack"
            )
        sweeps["lambda"] = _points(name, "lambda", _values("lambdas", float))
    if "n_attack" in FLAGS.sweeps:
        if method not in ("atp", "search"):
            sys.exit(
                f"--attack={name} is a {method!r} preset without steps; sweep N_attack on an ATP or search "
                f"preset ({atp_presets}, search, …)"
            )
        sweeps["n_attack"] = _points(name, "n_attack", _values("n_attacks", int))
    if "lr" in FLAGS.sweeps:
        if method != "atp":
            sys.exit(
                f"--attack={name} is a {method!r} preset without a learning rate; sweep lr on an ATP preset "
                f"({atp_presets})"
            )
        sweeps["lr"] = _points(name, "lr", _values("lrs", float))
    if "options" in FLAGS.sweeps:
        if method != "atp":
            sys.exit(
                f"--attack={name} is a {method!r} preset; the options sweep changes ATP options, use one of "
                f"{atp_presets}"
            )
        sweeps["options"] = {name: preset(name, seed=FLAGS.seed), **one_option_changes(name, seed=FLAGS.seed)}
    return sweeps


def main(argv):
    del argv
    jax_index, jax_count = maybe_initialize(FLAGS.distributed)  # before anything creates a backend
    sweeps = _sweep_configs()
    process_index = jax_index if FLAGS.process_index is None else FLAGS.process_index
    process_count = jax_count if FLAGS.process_count is None else FLAGS.process_count
    tag_process(process_index, process_count)
    out = Path(FLAGS.output_dir)

    style = PromptStyle(linearization=FLAGS.style)
    examples = selection.examples(process_index, process_count)
    if not examples:
        sys.exit(f"--dataset {FLAGS.dataset}: no examples selected; loosen --num_examples/--max_rows/--max_cols")
    identity = {
        "style": style.as_dict(),
        "seed": FLAGS.seed,
        "generate": FLAGS.generate,
        "max_new_tokens": FLAGS.max_new_tokens,
    }
    folders, done = {}, set()
    for parameter, configs in sweeps.items():  # one results folder per sweep, each with its manifest
        folders[parameter] = selection.open_folder(
            {**identity, "sweep": parameter, "base_attack": FLAGS.attack},
            {k: v.as_dict() for k, v in configs.items()},
            len(examples),
            folder=out / parameter,
            process_index=process_index,
            process_count=process_count,
        )
        done |= {(parameter, *key) for key in folders[parameter].done_keys()}
    sinks = selection.open_sinks(
        {**identity, "model": FLAGS.model, "dataset": FLAGS.dataset, "attack": FLAGS.attack, "sweeps": list(sweeps)},
        process_index,
        process_count,
    )
    model = load_model_from_flags()

    jobs = [
        Job(folders[p], name, config, tracking_name=f"{p}/{name}")
        for p, configs in sweeps.items()
        for name, config in configs.items()
    ]
    print(
        tagged(
            f"{len(examples)} examples x {len(jobs)} sweep points: {len(done)} recorded, "
            f"{len(pending(examples, jobs))} to run"
        )
    )
    run_pending(
        model,
        examples,
        jobs,
        style,
        sinks=sinks,
        progress=process_index == 0,
        desc="ablating",
        generate=FLAGS.generate,
        max_new_tokens=FLAGS.max_new_tokens,
        memory_budget_bytes=selection.memory_budget(),
        buckets=selection.bucket_grid(),
        batch_examples=FLAGS.batch_examples,
    )
    for sink in sinks:
        sink.close()
    if process_index != 0:
        return  # process 0 writes the tables and the figure: the others would race it for the same files

    if process_index != 0:  # process 0 writes the report, over every shard
        print(f"shard {process_index} of {process_count} done; process 0 writes {out / 'ablation.md'}")
        return
    # Every shard in the folders: the table covers whatever all processes have recorded so far.
    rows = {p: sweep_rows(merge_records(results_files(out / p)), p) for p in sweeps if p != "options"}
    sections = [f"### {FLAGS.attack}: {p} sweep\n\n{markdown_table(r)}" for p, r in rows.items()]
    if "options" in sweeps:
        options = option_rows(merge_records(results_files(out / "options")), FLAGS.attack)
        sections.append(f"### {FLAGS.attack}: one option changed at a time (same budget)\n\n{markdown_table(options)}")
    text = "\n\n".join(sections)
    print(text)
    (out / "ablation.md").write_text(text + "\n")
    written = [out / "ablation.md"]
    if rows:  # the options sweep has no numeric axis to plot
        written += plot_sweeps(rows, out / "ablation")
    print("wrote", ", ".join(map(str, written)))


def run() -> None:
    """The console script ``atp-ablate``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
