"""Adversarial training (the paper's A.9 defense): fine-tunes a model to answer right under the inner attack's
table orders, checkpointing as it goes, and exports the trained model for ``atp-attack`` to evaluate.

  atp-train --model smollm2-135m-instruct --dataset wtq --data_dir DATA --num_examples 200 \
      --inner atp_joint --steps 300 --batch_size 4 --learning_rate 1e-5 --output_dir results/train/atp_joint
  atp-attack --model results/train/atp_joint/model --attacks vanilla,best_of_k,strongest \
      --num_examples 24 --output_dir results/train/atp_joint/eval

``--inner`` is any attack spec: ``vanilla`` (a clean fine-tune on the original order), ``random`` (order
augmentation), ``best_of_k@k=K``, ``evolution`` (E-Search), ``atp_joint`` (ATP). ``--lora_rank R`` trains rank-R
adapters of the frozen model instead of every weight (for 0.5B and up). The questions of ``--heldout`` (default:
the bundled sample, what ``atp-attack`` evaluates by default) are never trained on.

``OUTPUT_DIR`` holds ``run.json`` and ``flags.txt`` (as ``atp-attack``'s: a resume under another model, data or
configuration is refused), the trainer's ``train.json``, ``train_log.jsonl`` (each step's examples, the orders they
were trained under, loss, gradient norm, seconds), ``skipped.json``, ``checkpoints/`` (orbax) and, at the end,
``model/``: the trained weights as an HF directory that ``--model`` reads. A run stopped at any point resumes from
its latest checkpoint when started again with the same flags.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from absl import flags

from atp_jax.attack.presets import canonical, preset
from atp_jax.cli import model_flags, selection
from atp_jax.cli.console import run_app
from atp_jax.data.datasets import DatasetUnavailableError
from atp_jax.models.loading import DEFAULT_MODEL
from atp_jax.runs.experiment import select_examples
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle
from atp_jax.train.lora import KERNELS
from atp_jax.train.step import SCHEDULES
from atp_jax.train.trainer import TrainConfig, checkpointed_step, export, train

selection.define_flags(num_examples=0, sharding=False)
selection.define_run_flags(model=DEFAULT_MODEL, output_dir="results/train", memory_budget=False)
flags.DEFINE_string(
    "heldout",
    "sample",
    "A dataset (as --dataset: sample, wtq, path.jsonl …) whose question ids are never trained on: the questions "
    "the trained model is evaluated on. Empty: none held out.",
)
flags.DEFINE_string("inner", "vanilla", "The inner attack: vanilla (clean), random, best_of_k@k=K, evolution, …")
flags.DEFINE_integer("steps", 100, "Optimizer steps.")
flags.DEFINE_integer("batch_size", 4, "Questions per step.")
flags.DEFINE_float("learning_rate", 1e-5, "AdamW's peak learning rate.")
flags.DEFINE_integer("warmup_steps", 0, "Linear warm-up steps.")
flags.DEFINE_enum("schedule", "constant", list(SCHEDULES), "After the warm-up: hold, or a half cosine to 0.")
flags.DEFINE_float("weight_decay", 0.0, "AdamW's decoupled weight decay (never on norms or biases).")
flags.DEFINE_float("grad_clip", 1.0, "Clip the gradient's global norm to this (0: no clipping).")
flags.DEFINE_integer("lora_rank", 0, "0: train every weight; R >= 1: rank-R adapters of the frozen model.")
flags.DEFINE_float("lora_alpha", 16.0, "The adapters' update is scaled by alpha / rank.")
flags.DEFINE_list("lora_targets", list(KERNELS), "The kernels that get adapters.")
flags.DEFINE_integer("seed", 0, "Decides the batches, the inner attacks' seeds and the adapters' start.")
flags.DEFINE_integer("checkpoint_every", 25, "Steps between checkpoints (the last step is always saved).")
flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
FLAGS = flags.FLAGS


def _config() -> TrainConfig:
    try:
        preset(FLAGS.inner)
        return TrainConfig(
            attack=FLAGS.inner,
            steps=FLAGS.steps,
            batch_size=FLAGS.batch_size,
            learning_rate=FLAGS.learning_rate,
            warmup_steps=FLAGS.warmup_steps,
            schedule=FLAGS.schedule,
            weight_decay=FLAGS.weight_decay,
            grad_clip=FLAGS.grad_clip,
            lora_rank=FLAGS.lora_rank,
            lora_alpha=FLAGS.lora_alpha,
            lora_targets=tuple(FLAGS.lora_targets),
            seed=FLAGS.seed,
            checkpoint_every=FLAGS.checkpoint_every,
            style=PromptStyle(linearization=FLAGS.style),
        )
    except ValueError as e:
        sys.exit(f"atp-train: {e}")


def _training_examples():
    """The selection's questions less the held-out ones, the first ``--num_examples`` of them (0: all)."""
    try:
        pool = select_examples(
            FLAGS.dataset,
            FLAGS.split,
            FLAGS.data_dir,
            0,
            FLAGS.filter_order_sensitive,
            FLAGS.max_rows,
            FLAGS.max_cols,
            order_filter=FLAGS.order_filter,
            ids=FLAGS.ids,
        )
    except (OSError, ValueError, DatasetUnavailableError) as e:
        sys.exit(f"--dataset {FLAGS.dataset}: {e}")
    heldout = set()
    if FLAGS.heldout:
        try:
            heldout = {e.id for e in select_examples(FLAGS.heldout, FLAGS.split, FLAGS.data_dir, 0, False)}
        except (OSError, ValueError, DatasetUnavailableError) as e:
            sys.exit(f"--heldout {FLAGS.heldout}: {e}")
    kept = [example for example in pool if example.id not in heldout]
    if not kept:
        sys.exit(
            f"--dataset {FLAGS.dataset}: no question is left to train on once the {len(heldout)} of --heldout "
            f"{FLAGS.heldout} are held out; train on another dataset or split (--split train)"
        )
    return kept[: FLAGS.num_examples or None], len(pool) - len(kept)


def main(argv):
    del argv
    config = _config()
    mesh = model_flags.check_model_flags()
    examples, held = _training_examples()
    identity = {"training": config.identity(), "heldout": FLAGS.heldout}
    inner = canonical(config.attack)
    folder = selection.open_folder(identity, {inner: dataclasses.asdict(config.attack_config)}, len(examples))
    output = Path(FLAGS.output_dir)
    if checkpointed_step(output, config) < config.steps:
        folder.record_session()  # steps will run: this session is part of what made the weights
    model = model_flags.load_model_from_flags(mesh=mesh)
    print(
        f"training {model.name} on {len(examples)} questions ({held} held out), inner attack {inner}, "
        f"{config.steps} steps of {config.batch_size}"
    )
    try:
        result = train(model, examples, config, output)
    except FloatingPointError as e:
        sys.exit(f"atp-train: {e}")
    except ValueError as e:
        sys.exit(f"atp-train: {e}")
    exported = export(model, result.params, config, output / "model")
    losses = result.losses
    first, last = losses[: min(10, len(losses))], losses[-min(10, len(losses)) :]
    print(
        f"{result.steps} steps ({result.resumed_from} resumed), {result.usable} questions trained on, skipped "
        f"{result.skipped or 'none'}, {result.fallbacks} orders fell back to the original; mean loss of the first "
        f"{len(first)} steps {sum(first) / len(first):.3f}, of the last {len(last)} {sum(last) / len(last):.3f}"
    )
    print(f"trained model: {exported} (evaluate: atp-attack --model {exported} --attacks vanilla,best_of_k,strongest)")


def run() -> None:
    """The console script ``atp-train``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
