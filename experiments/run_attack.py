"""Runs attacks on table-QA examples and records one result per (example, attack).

  python experiments/run_attack.py --model smollm2-135m-instruct --num_examples 12 \
      --attacks vanilla,best_of_k,paper,search,search_reversed,search_random --output_dir results/smollm

Results go to ``OUTPUT_DIR/results.jsonl`` (or ``results.shardK.jsonl`` per process), appended
atomically; a rerun skips the (id, attack) pairs already recorded. ``run.json`` holds the config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
from absl import app, flags
from tqdm import tqdm

import atp_jax
from atp_jax.attack.config import PRESETS, preset
from atp_jax.attack.problem import AttackInputError, make_problem
from atp_jax.attack.run import attack
from atp_jax.data.datasets import filter_examples, load_dataset
from atp_jax.eval.metrics import score
from atp_jax.eval.qa import answers
from atp_jax.eval.records import append_record, done_keys, read_records
from atp_jax.eval.report import markdown_table, summarize
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle

flags.DEFINE_string("model", "smollm2-135m-instruct", "Zoo name, HF model directory or .gguf file.")
flags.DEFINE_string("dataset", "sample", "sample | wtq | tatqa | fetaqa | path.jsonl")
flags.DEFINE_string("data_dir", None, "Folder with wtq/, tatqa/, fetaqa/ (default: $ATP_JAX_DATA).")
flags.DEFINE_string("split", "dev", "Dataset split.")
flags.DEFINE_integer("num_examples", 3, "Examples to attack (after filtering), 0 for all.")
flags.DEFINE_bool("filter_order_sensitive", True, "Keep only questions that mention order (paper's rule).")
flags.DEFINE_integer("max_rows", 12, "Skip tables with more data rows.")
flags.DEFINE_integer("max_cols", 8, "Skip tables with more columns.")
flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
flags.DEFINE_list("attacks", ",".join(PRESETS), f"Comma list of: {', '.join(PRESETS)}.")
flags.DEFINE_integer("n_attack", None, "Override steps/iterations of gradient attacks.")
flags.DEFINE_float("lambda_row", None, "Override λ_r of ATP attacks.")
flags.DEFINE_float("lambda_col", None, "Override λ_c of ATP attacks.")
flags.DEFINE_integer("restarts", None, "Override restarts of ATP attacks.")
flags.DEFINE_integer("seed", 0, "Seed of every attack.")
flags.DEFINE_integer("max_new_tokens", 32, "Generation budget for the answer under the chosen order.")
flags.DEFINE_bool("generate", True, "Generate and score the model's answer under each chosen order.")
flags.DEFINE_string("output_dir", "results/demo", "Where results.jsonl and run.json go.")
flags.DEFINE_integer("process_index", None, "This process's shard (default: jax.process_index()).")
flags.DEFINE_integer("process_count", None, "Number of shards (default: jax.process_count()).")
FLAGS = flags.FLAGS

_GRADIENT_METHODS = ("atp", "search")


def _config(name: str):
    overrides = {"seed": FLAGS.seed}
    base = PRESETS[name]
    if base.method in _GRADIENT_METHODS and FLAGS.n_attack is not None:
        overrides["n_attack"] = FLAGS.n_attack
    if base.method == "atp":
        for field in ("lambda_row", "lambda_col", "restarts"):
            if getattr(FLAGS, field) is not None:
                overrides[field] = getattr(FLAGS, field)
    return preset(name, **overrides)


def main(argv):
    del argv
    unknown = [a for a in FLAGS.attacks if a not in PRESETS]
    if unknown:
        sys.exit(f"unknown attack(s) {', '.join(unknown)}; known: {', '.join(PRESETS)}")
    process_index = jax.process_index() if FLAGS.process_index is None else FLAGS.process_index
    process_count = jax.process_count() if FLAGS.process_count is None else FLAGS.process_count
    out = Path(FLAGS.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = out / ("results.jsonl" if process_count == 1 else f"results.shard{process_index}.jsonl")

    model = atp_jax.load_model(FLAGS.model)
    style = PromptStyle(linearization=FLAGS.style)
    examples = filter_examples(
        load_dataset(FLAGS.dataset, FLAGS.split, FLAGS.data_dir),
        order_sensitive=True if FLAGS.filter_order_sensitive else None,
        max_rows=FLAGS.max_rows, max_cols=FLAGS.max_cols,
    )
    if FLAGS.num_examples:
        examples = examples[: FLAGS.num_examples]
    examples = examples[process_index::process_count]
    configs = {name: _config(name) for name in FLAGS.attacks}
    manifest = {
        "model": model.name, "model_source": model.source, "dataset": FLAGS.dataset, "split": FLAGS.split,
        "style": dataclasses.asdict(style), "attacks": {k: dataclasses.asdict(v) for k, v in configs.items()},
        "examples": len(examples), "seed": FLAGS.seed, "jax": jax.__version__, "atp_jax": atp_jax.__version__,
        "python": platform.python_version(), "devices": [str(d) for d in jax.devices()],
        "process_index": process_index, "process_count": process_count, "argv": sys.argv,
    }
    (out / ("run.json" if process_count == 1 else f"run.shard{process_index}.json")).write_text(
        json.dumps(manifest, indent=2)
    )

    done = done_keys([results])
    todo = [(ex, name) for ex in examples for name in configs if (ex.id, name) not in done]
    print(f"{len(examples)} examples x {len(configs)} attacks: {len(done)} recorded, {len(todo)} to run")
    bar = tqdm(total=len(todo), desc="attacking")
    for example in examples:
        names = [n for n in configs if (example.id, n) not in done]
        if not names:
            continue
        problems = {}
        for name in names:
            config = configs[name]
            try:
                if config.objective not in problems:
                    problems[config.objective] = make_problem(model, example, style, config.objective)
                result = attack(model, example, config, style, name=name, problem=problems[config.objective])
            except AttackInputError as e:
                append_record(results, {"id": example.id, "attack": name, "skipped": str(e)})
                bar.update()
                continue
            start = time.perf_counter()
            prediction = None
            scores = {}
            if FLAGS.generate:
                (prediction,) = answers(model, example, [result.table], style, FLAGS.max_new_tokens)
                scores = score(example.dataset or "wtq", prediction, example.answers, example.meta)
            append_record(results, {
                "id": example.id, "attack": name, "row_perm": list(result.row_perm),
                "col_perm": list(result.col_perm), "prediction": prediction, "scores": scores,
                "answer_loss": result.loss, "clean_loss": result.clean_loss, "queries": result.forward_calls,
                "backward_calls": result.backward_calls, "seconds": result.seconds,
                "generate_seconds": time.perf_counter() - start, "trace": result.trace,
            })
            bar.update()
    bar.close()
    records = [r for r in read_records(results) if "skipped" not in r]
    print(markdown_table(summarize(records)))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main)
