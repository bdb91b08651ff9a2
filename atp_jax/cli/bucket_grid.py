"""The shape distribution of the dev sets and what a bucket grid makes of it: how many distinct buckets (each a
set of compiled programs) and how many padded tokens (extra compute).

  atp-bucket-grid --data_dir DATA --models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct

For each tokenizer and dataset, over the tables a sweep would take (``--max_rows``/``--max_cols``; then
every table up to ``--larger_rows``/``--larger_cols``): the percentiles of every size a layout has (body,
prefix, answer, rows, columns, tokens per cell), the distinct exact shapes against the distinct buckets of
the default grid, and the padding cost: body tokens and whole-sequence tokens (prefix + body) the decoder
runs, padded over real. Then, for the first ``--sweep`` questions of the order-filtered selection (what a
``run_attack.py --dataset D --num_examples`` sweep meets), the buckets met with the prompt's lengths at 1, 2 or 4
rungs per octave (``--bucket_steps``). ``--datasets sample`` counts the bundled sample, what ``run_attack.py``
attacks by default, and needs no data folder. Reads the tokenizers only; no model runs.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import flags

from atp_jax.cli.console import run_app
from atp_jax.data.datasets import SAMPLE, filter_examples, load_dataset
from atp_jax.models import gguf, zoo
from atp_jax.tables.buckets import DEFAULT_BUCKETS, Sizes
from atp_jax.tables.layout import build_layout

flags.DEFINE_string("data_dir", None, "Folder with wtq/, tatqa/, fetaqa/ (default: $ATP_JAX_DATA).")
flags.DEFINE_list("datasets", ["wtq", "tatqa", "fetaqa"], "Datasets (dev split); sample is the bundled one.")
flags.DEFINE_list(
    "models", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"], "Zoo models whose tokenizers count."
)
flags.DEFINE_integer("max_rows", 12, "The sweep's table limit: data rows.")
flags.DEFINE_integer("max_cols", 8, "The sweep's table limit: columns.")
flags.DEFINE_integer("larger_rows", 40, "The larger tables also counted: data rows.")
flags.DEFINE_integer("larger_cols", 12, "The larger tables also counted: columns.")
flags.DEFINE_integer("sweep", 24, "Questions of the order-filtered selection counted as one sweep.")
FLAGS = flags.FLAGS

SIZES = ("body", "prefix", "answer", "rows", "cols", "cell_tokens")
LENGTH_STEPS = (1, 2, 4)  # the sweep table's columns: rungs per octave of the prompt's lengths


def _sizes(tokenizer, examples) -> list[Sizes]:
    return [build_layout(tokenizer, example).sizes for example in examples]


def _summary(sizes: list[Sizes], grid) -> dict:
    padded = [grid.fit(s) for s in sizes]
    real_tokens = sum(s.prefix + s.body for s in sizes)
    return {
        "tables": len(sizes),
        "exact shapes": len(set(sizes)),
        "buckets": len(set(padded)),
        "body padded/real": sum(p.body for p in padded) / sum(s.body for s in sizes),
        "sequence padded/real": sum(p.prefix + p.body for p in padded) / real_tokens,
    }


def _percentiles(sizes: list[Sizes]) -> list[str]:
    rows = []
    for name in SIZES:
        values = np.array([getattr(s, name) for s in sizes])
        low, p10, p50, p90, high = np.percentile(values, [0, 10, 50, 90, 100]).astype(int)
        rows.append(f"| {name} | {low} | {p10} | {p50} | {p90} | {high} | {len(set(values))} |")
    return rows


def main(argv):
    del argv
    data_dir = FLAGS.data_dir or os.environ.get("ATP_JAX_DATA")
    if not data_dir and set(FLAGS.datasets) - {SAMPLE}:
        sys.exit("--data_dir: give the folder holding wtq/, tatqa/ and fetaqa/ (or set $ATP_JAX_DATA)")
    grids = {steps: DEFAULT_BUCKETS.with_length_steps(steps) for steps in LENGTH_STEPS}
    for model in FLAGS.models:
        tokenizer = gguf.load_gguf_tokenizer(zoo.resolve(model))
        print(f"\n## {model}\n")
        summary_rows, sweep_rows = [], []
        for dataset in FLAGS.datasets:
            try:
                examples = load_dataset(dataset, "dev", data_dir)
            except (OSError, ValueError) as e:
                sys.exit(f"--datasets {dataset}: {e}")
            selected = filter_examples(examples, max_rows=FLAGS.max_rows, max_cols=FLAGS.max_cols)
            larger = filter_examples(examples, max_rows=FLAGS.larger_rows, max_cols=FLAGS.larger_cols)
            sizes, larger_sizes = _sizes(tokenizer, selected), _sizes(tokenizer, larger)
            print(f"### {dataset}: {len(selected)} questions with tables of <= {FLAGS.max_rows}x{FLAGS.max_cols}\n")
            print("| size | min | p10 | median | p90 | max | distinct |\n|---|---|---|---|---|---|---|")
            print("\n".join(_percentiles(sizes)) + "\n")
            for label, group in (
                (f"<= {FLAGS.max_rows}x{FLAGS.max_cols}", sizes),
                (f"<= {FLAGS.larger_rows}x{FLAGS.larger_cols}", larger_sizes),
            ):
                s = _summary(group, DEFAULT_BUCKETS)
                summary_rows.append(
                    f"| {dataset} | {label} | {s['tables']} | {s['exact shapes']} | {s['buckets']} | "
                    f"{s['body padded/real']:.3f} | {s['sequence padded/real']:.3f} |"
                )
            sweep = filter_examples(examples, order_sensitive=False, max_rows=FLAGS.max_rows, max_cols=FLAGS.max_cols)
            sweep_sizes = _sizes(tokenizer, sweep[: FLAGS.sweep])
            cells = [f"{len(set(sweep_sizes))}"]
            for grid in grids.values():
                s = _summary(sweep_sizes, grid)
                cells.append(f"{s['buckets']} ({s['sequence padded/real']:.2f})")
            sweep_rows.append(f"| {dataset} | {len(sweep_sizes)} | " + " | ".join(cells) + " |")
        print("### The default grid\n")
        print("| dataset | tables | questions | exact shapes | buckets | body padded/real | sequence padded/real |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(summary_rows) + "\n")
        print(f"### One sweep: the first {FLAGS.sweep} order-free questions <= {FLAGS.max_rows}x{FLAGS.max_cols}\n")
        steps = [f"{n} step{'s' * (n > 1)}" for n in LENGTH_STEPS]
        rungs = ", ".join(map(str, LENGTH_STEPS))
        print(
            f"Buckets met (sequence tokens padded/real) with the prompt's lengths at {rungs} rungs per octave "
            "(`--bucket_steps`; 2 is the default).\n"
        )
        print("| dataset | questions | exact shapes | " + " | ".join(steps) + " |")
        print("|---" * (3 + len(steps)) + "|")
        print("\n".join(sweep_rows))


def run() -> None:
    """The console script ``atp-bucket-grid``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
