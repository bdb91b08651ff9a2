"""Answers table questions with a model: one toy question, or a dataset with its score.

atp-answer                                           # the default model on a toy table
atp-answer --model smollm2-135m-instruct --question "Who has 7 goals?"
atp-answer --dataset sample --num_examples 180       # vanilla accuracy on the sample
"""

from __future__ import annotations

import json
import statistics
import time

from absl import flags
from tqdm import tqdm

import atp_jax
from atp_jax.cli import model_flags
from atp_jax.cli.console import run_app
from atp_jax.data.datasets import load_dataset
from atp_jax.eval.scoring import score
from atp_jax.inference.qa import answers
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle

model_flags.define_model_flags(atp_jax.DEFAULT_MODEL)
_QUESTION = flags.DEFINE_string("question", "Who scored the most goals?", "Question about the table.")
_TABLE = flags.DEFINE_string(
    "table",
    json.dumps(
        {
            "header": ["Player", "Team", "Goals"],
            "rows": [["Alice", "Red", "12"], ["Bob", "Blue", "7"], ["Carol", "Green", "9"]],
        }
    ),
    'Table as JSON: {"header": [...], "rows": [[...], ...]}.',
)
_DATASET = flags.DEFINE_string("dataset", None, "sample | wtq | tatqa | fetaqa | path.jsonl: score the model on it.")
_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", None, "Use the first N examples of --dataset.")
_STYLE = flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
_REASONING = flags.DEFINE_enum("reasoning", "concise", ["concise", "step_by_step"], "Answer style.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", None, "Generation budget (default by reasoning style).")


def main(argv):
    del argv
    model = model_flags.load_model_from_flags()
    print(f"loaded {model.name} in {model.load_seconds:.1f} s")
    style = PromptStyle(linearization=_STYLE.value, reasoning=_REASONING.value)
    if _DATASET.value is None:
        table = json.loads(_TABLE.value)
        example = atp_jax.Example(_QUESTION.value, atp_jax.Table(table["header"], table["rows"]), [], "cli")
        start = time.perf_counter()
        reply = atp_jax.answer(model, example, style=style, max_new_tokens=_MAX_NEW_TOKENS.value)
        print(f"Q: {_QUESTION.value}\nA: {reply}\n({time.perf_counter() - start:.1f} s)")
        return

    examples = load_dataset(_DATASET.value)[: _NUM_EXAMPLES.value]
    totals: dict[str, list[float]] = {}
    start = time.perf_counter()
    for example in (bar := tqdm(examples, desc="answering")):
        (prediction,) = answers(model, example, [example.table], style, _MAX_NEW_TOKENS.value)
        for metric, value in score(example.dataset or "wtq", prediction, example.answers, example.meta).items():
            totals.setdefault(metric, []).append(value)
        bar.set_postfix({m: f"{statistics.fmean(v):.3f}" for m, v in totals.items()})
    print(
        f"{model.name} on {_DATASET.value} ({len(examples)} examples, {style.linearization}, {style.reasoning}): "
        + ", ".join(f"{m} = {statistics.fmean(v):.3f}" for m, v in totals.items())
        + f" ({time.perf_counter() - start:.0f} s)"
    )


def run() -> None:
    """The console script ``atp-answer``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
