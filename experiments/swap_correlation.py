"""Does the gradient know which swaps hurt? Spearman correlation between the first-order prediction and the
true objective change of every single row/column swap at the original order, per example.

  python experiments/swap_correlation.py --model smollm2-135m-instruct --num_examples 12
"""

from __future__ import annotations

import json
import statistics

from absl import app, flags
from tqdm import tqdm

import atp_jax
from atp_jax.attack.problem import AttackInputError, make_problem
from atp_jax.attack.result import Evaluator
from atp_jax.attack.search import swap_rank_correlation
from atp_jax.runs.experiment import select_examples

_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "Zoo name, HF model directory or .gguf file.")
_DATASET = flags.DEFINE_string("dataset", "sample", "sample | wtq | tatqa | fetaqa | path.jsonl")
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples",
    12,
    "First order-free questions of ≤ 12 rows × ≤ 8 columns (as in run_attack.py --max_rows 12 --max_cols 8).",
)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the per-example figures here.")


def main(argv):
    del argv
    model = atp_jax.load_model(_MODEL.value)
    examples = select_examples(_DATASET.value, num_examples=_NUM_EXAMPLES.value, max_rows=12, max_cols=8)
    rows = []
    for example in tqdm(examples, desc="swaps"):
        try:
            stats = swap_rank_correlation(Evaluator(model, make_problem(model, example)))
        except AttackInputError as e:
            print(f"skip {example.id}: {e}")
            continue
        rows.append({"id": example.id, **stats})
    print("| id | swaps | spearman | gain of top-predicted swap | best true gain | mean true gain |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['id']} | {r['swaps']} | {r['spearman']:.3f} | {r['gain_of_top_predicted_swap']:.3f} | "
            f"{r['best_true_gain']:.3f} | {r['mean_true_gain']:.3f} |"
        )
    print(f"median spearman {statistics.median(r['spearman'] for r in rows):.3f} over {len(rows)} examples")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    app.run(main)
