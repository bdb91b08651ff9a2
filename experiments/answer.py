"""Answers a table question with a zoo model (the quickest end-to-end check of an install).

  python experiments/answer.py                      # the default model on a toy table
  python experiments/answer.py --model smollm2-135m-instruct --question "Who has 7 goals?"
"""

from __future__ import annotations

import json
import time

from absl import app, flags

import atp_jax
from atp_jax.eval.generate import generate_chat

_MODEL = flags.DEFINE_string("model", atp_jax.DEFAULT_MODEL, "Zoo name, HF model directory or .gguf file.")
_QUESTION = flags.DEFINE_string("question", "Who scored the most goals?", "Question about the table.")
_TABLE = flags.DEFINE_string(
    "table",
    json.dumps({"header": ["Player", "Team", "Goals"],
                "rows": [["Alice", "Red", "12"], ["Bob", "Blue", "7"], ["Carol", "Green", "9"]]}),
    'Table as JSON: {"header": [...], "rows": [[...], ...]}.',
)
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32, "Generation budget.")


def _markdown(table: dict) -> str:
    lines = ["| " + " | ".join(table["header"]) + " |", "|" + " --- |" * len(table["header"])]
    lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def main(argv):
    del argv
    model = atp_jax.load_model(_MODEL.value)
    print(f"loaded {model.name} in {model.load_seconds:.1f} s")
    table = json.loads(_TABLE.value)
    user = f"Answer the question using the table.\n\nTable:\n{_markdown(table)}\n\nQuestion: {_QUESTION.value}"
    start = time.perf_counter()
    (reply,) = generate_chat(model, [user], max_new_tokens=_MAX_NEW_TOKENS.value)
    print(f"Q: {_QUESTION.value}\nA: {reply}\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    app.run(main)
