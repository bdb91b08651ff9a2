"""Adversarial training (seed paper, A.9): for each example find a worst-case table order on the current
weights, and train the model to give the reference answer under it.

Each step takes a batch of examples, runs the inner attack (any preset spec: ``vanilla`` is a clean fine-tune
and skips the attack, ``random`` is order augmentation, ``best_of_k@k=K``, ``evolution`` (E-Search), ``atp_joint``
(ATP)) on every example with the weights as they are at that step, re-renders and tokenizes the prompt over the
permuted table (as ``atp_jax.inference.qa.answer_losses`` does), and takes one AdamW step on the reference
answers' cross-entropy (``atp_jax.train.step``).

Reproducible and resumable: a step's batch and its attacks' seeds are functions of ``(seed, step)``, and the
trainable parameters, the optimizer state and the step are checkpointed with orbax, so a run killed at any point
and started again with the same arguments ends with the parameters and per-step losses of a run never
interrupted. ``OUTPUT_DIR`` holds:

* ``train.json``: what a resume must share (the configuration but its length, the model, the usable examples);
* ``train_log.jsonl``: one line per step: the examples, the order each was trained under (and the inner
  attack's loss and seed), the loss, the gradient norm, the learning rate and the seconds;
* ``skipped.json``: the examples left out before training, counted by reason;
* ``checkpoints/<step>/``: the state after that step, the newest ``keep`` kept.

Steps are numbered from 1: step k is the k-th update, checkpoint k the state after it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from flax.traverse_util import flatten_dict, unflatten_dict

from atp_jax import jsonl
from atp_jax.attack.presets import canonical, preset
from atp_jax.attack.problem import AttackInputError
from atp_jax.attack.run import attack, check_mode
from atp_jax.inference.qa import InputTooLong, check_context, prompt_ids
from atp_jax.models.loading import LoadedModel
from atp_jax.models.params import export_hf
from atp_jax.models.partitioning import weight_shardings
from atp_jax.sharding import DATA, axis_size
from atp_jax.tables.buckets import DEFAULT_BUCKETS
from atp_jax.tables.layout import build_layout
from atp_jax.tables.prompt import PromptStyle, encode_text, reference_answer
from atp_jax.tables.table import Example
from atp_jax.train.lora import KERNELS, LoraConfig
from atp_jax.train.step import (
    Batch,
    TrainStepConfig,
    init_optimizer,
    init_params,
    learning_rate,
    place,
    settings,
    train_step,
    trained_model,
    with_weights,
)

LOG = "train_log.jsonl"
SKIPPED = "skipped.json"
MANIFEST = "train.json"
CHECKPOINTS = "checkpoints"
# Why an example is left out before training (the keys of ``TrainResult.skipped`` and ``skipped.json``).
NO_ANSWER, TOO_SMALL, TOO_LONG = "no_reference_answer", "too_small", "too_long"
# Fields that may change between a run and its resume: how long it runs and how it is checkpointed. ``steps``
# is part of the identity under a cosine schedule, whose every rate depends on it.
_RESUMABLE_CHANGES = ("steps", "checkpoint_every", "keep")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """An adversarial-training run.

    attack: the inner attack's spec (``atp_jax.attack.presets.preset``): ``vanilla`` (a clean fine-tune: no
      attack, the original order), ``random`` (order augmentation), ``best_of_k@k=K``, ``evolution``, ``atp_joint``…
    steps: optimizer steps; batch_size: examples per step.
    learning_rate, warmup_steps, schedule, weight_decay, grad_clip: the optimizer (``TrainStepConfig``).
    lora_rank: 0 trains every parameter (a full fine-tune); r ≥ 1 trains rank-r adapters of ``lora_targets``
      scaled by ``lora_alpha / r`` (``atp_jax.train.lora``), the model frozen.
    seed: decides the batches, the attacks' seeds and the adapters' start.
    checkpoint_every: steps between checkpoints (the last step is always saved); keep: checkpoints kept.
    style: the prompt style the attack and the training prompts use.
    """

    attack: str = "vanilla"
    steps: int = 100
    batch_size: int = 8
    learning_rate: float = 1e-5
    warmup_steps: int = 0
    schedule: str = "constant"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = KERNELS
    seed: int = 0
    checkpoint_every: int = 50
    keep: int = 2
    style: PromptStyle = PromptStyle()

    def __post_init__(self):
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        preset(self.attack)  # an unknown attack or field is named with the presets there are
        for name in ("steps", "batch_size", "checkpoint_every", "keep"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name}={getattr(self, name)}; it must be >= 1")
        if self.lora_rank < 0:
            raise ValueError(f"TrainConfig.lora_rank={self.lora_rank}; 0 (full fine-tune) or a rank >= 1")
        _ = self.step_config  # validates the optimizer's fields and the LoRA targets

    @property
    def attack_config(self):
        return preset(self.attack, seed=self.seed)

    @property
    def is_clean(self) -> bool:
        """A clean fine-tune: the original order, no attack run."""
        return self.attack_config.method == "vanilla"

    @property
    def lora(self) -> LoraConfig | None:
        return None if self.lora_rank == 0 else LoraConfig(self.lora_rank, self.lora_alpha, self.lora_targets)

    @property
    def step_config(self) -> TrainStepConfig:
        return TrainStepConfig(
            learning_rate=self.learning_rate,
            warmup_steps=self.warmup_steps,
            schedule=self.schedule,
            total_steps=self.steps,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            lora=self.lora,
        )

    def as_dict(self) -> dict:
        fields = dataclasses.asdict(self)
        fields["attack"] = canonical(self.attack)
        fields["lora_targets"] = list(self.lora_targets)
        fields["style"] = self.style.as_dict()
        return fields

    def identity(self) -> dict:
        """What a resumed run must share with the run it resumes."""
        fields = self.as_dict()
        for name in _RESUMABLE_CHANGES:
            if not (name == "steps" and self.schedule == "cosine"):
                fields.pop(name)
        if self.lora_rank == 0:  # the adapters' settings mean nothing to a full fine-tune
            for name in ("lora_alpha", "lora_targets"):
                fields.pop(name)
        return fields


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run ends with.

    model: the trained model (LoRA merged into its weights), ready for ``attack``, ``answer`` or ``export``.
    params: the trainable parameters (full fine-tune: every weight's pure dict; LoRA: the adapters).
    steps: the steps completed (``config.steps``); resumed_from: the checkpoint's step it started from, or 0.
    losses: every step's training loss, from the log (a resumed run's earlier steps included).
    usable: examples trained on; skipped: the others, counted by reason (``NO_ANSWER``, ``TOO_SMALL``,
      ``TOO_LONG``).
    fallbacks: (step, example) pairs trained under the original order because the inner attack refused the
      example on the weights of that step, or its order's prompt did not fit the context (each logged).
    """

    model: LoadedModel
    params: dict
    steps: int
    resumed_from: int
    losses: tuple[float, ...]
    usable: int
    skipped: dict[str, int]
    fallbacks: int
    output_dir: Path


def batch_indices(count: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Indices into the ``count`` usable examples for ``step`` (from 1): the examples are read in epochs, epoch
    ``e`` being the permutation ``default_rng([seed, e])`` draws, ``batch_size`` at a time across epoch ends. A
    function of its arguments only, so a resumed run sees the batches an uninterrupted one sees."""
    indices, orders = [], {}
    for k in range((step - 1) * batch_size, step * batch_size):
        epoch, position = divmod(k, count)
        if epoch not in orders:
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(count)
        indices.append(int(orders[epoch][position]))
    return indices


def attack_seed(seed: int, step: int, index: int) -> int:
    """The inner attack's seed for the ``index``-th example of ``step``'s batch (a non-negative int32)."""
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1)[0] & 0x7FFFFFFF)


def usable_examples(
    loaded: LoadedModel, examples: Sequence[Example], config: TrainConfig
) -> tuple[list[Example], dict[str, dict[str, str]]]:
    """The examples a run can train on, and for each other one ``{id: {"reason", "message"}}``.

    Left out: no reference answer (``NO_ANSWER``); for an attack, a table it cannot reorder (no data row or
    column, 1 × 1, one row for a row attack, one column for a column attack: ``TOO_SMALL``); a prompt plus answer
    over the model's context (``TOO_LONG``). The checks are the attack's own, made before any model call.
    """
    ids = [example.id for example in examples]
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ValueError(
            f"example ids must be unique (the training log names examples by id); repeated: {repeated[:5]}"
        )
    usable, skipped = [], {}
    attack_config = config.attack_config
    for example in examples:
        try:
            target = encode_text(loaded.tokenizer, reference_answer(example))
        except ValueError as e:
            skipped[example.id] = {"reason": NO_ANSWER, "message": str(e)}
            continue
        try:
            if not config.is_clean:
                table = example.table
                if table.n_rows == 0 or table.n_cols == 0 or (table.n_rows < 2 and table.n_cols < 2):
                    raise AttackInputError(
                        f"example {example.id!r}: a {table.n_rows}x{table.n_cols} table has no order to attack"
                    )
                check_mode(example, attack_config)
        except AttackInputError as e:
            skipped[example.id] = {"reason": TOO_SMALL, "message": str(e)}
            continue
        try:
            check_context(loaded, example, len(prompt_ids(loaded, example, style=config.style)), len(target))
            if not config.is_clean:  # the attack's own layout (cells tokenized one by one) must fit too
                length = build_layout(loaded.tokenizer, example, style=config.style).seq_length
                check_context(loaded, example, length, 0)
        except InputTooLong as e:
            skipped[example.id] = {"reason": TOO_LONG, "message": str(e)}
            continue
        usable.append(example)
    return usable, skipped


def make_batch(rows: Sequence[tuple[list[int], list[int]]], batch_rows: int) -> Batch:
    """A ``Batch`` of ``(prompt ids, answer ids)`` pairs, padded to ``batch_rows`` rows and to the default grid's
    text and answer buckets (one compiled step per bucket, not per batch)."""
    longest = max(len(prompt) + len(target) for prompt, target in rows)
    S = DEFAULT_BUCKETS.text_length(longest)
    answer = max(len(target) for _, target in rows)
    A = answer if DEFAULT_BUCKETS.answer is None else DEFAULT_BUCKETS.answer.fit(answer)
    ids = np.zeros((batch_rows, S), np.int32)
    positions = np.zeros((batch_rows, A), np.int32)
    targets = np.zeros((batch_rows, A), np.int32)
    target_mask = np.zeros((batch_rows, A), np.float32)
    example_mask = np.zeros((batch_rows,), np.float32)
    for b, (prompt, target) in enumerate(rows):
        P, T = len(prompt), len(target)
        ids[b, : P + T] = prompt + target
        positions[b, :T] = np.arange(P - 1, P - 1 + T)  # the logits at i predict token i + 1
        targets[b, :T] = target
        target_mask[b, :T] = 1.0
        example_mask[b] = 1.0
    return Batch(ids, positions, targets, target_mask, example_mask)


def train(
    loaded: LoadedModel,
    examples: Sequence[Example],
    config: TrainConfig,
    output_dir: str | os.PathLike,
    mesh=None,
    progress: bool = True,
) -> TrainResult:
    """Trains ``loaded`` on ``examples`` under the inner attack's orders; resumes from ``output_dir``'s latest
    checkpoint when there is one. ``loaded`` itself is left unchanged.

    ``mesh`` (a ``jax.sharding.Mesh``; default: the model's) splits every batch over its ``data`` axis; a model
    loaded without one is placed on it (its weights copied along ``data``, split along ``model``).

    Raises ``ValueError`` when no example is usable or the folder holds another run, ``FloatingPointError`` when a
    step's loss or gradient is not finite (that step is not saved; the last good checkpoint is kept).
    """
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    loaded = _on_mesh(loaded, mesh)
    usable, skipped = usable_examples(loaded, examples, config)
    counts = dict(sorted(Counter(entry["reason"] for entry in skipped.values()).items()))
    _write_json(output / SKIPPED, {"counts": counts, "examples": skipped})
    if not usable:
        raise ValueError(
            f"none of the {len(examples)} examples can be trained on (left out: "
            f"{', '.join(f'{n} {reason}' for reason, n in counts.items()) or 'none'}; see {output / SKIPPED}); "
            "give examples with a reference answer, a table the attack can reorder and a prompt within the context"
        )
    _check_manifest(output, loaded, config, [example.id for example in usable])

    step_config = config.step_config
    params = init_params(loaded.model, step_config, jax.random.key(config.seed))
    opt_state = init_optimizer(params, step_config)
    manager = _checkpoints(output, config)
    start = manager.latest_step() or 0
    if start > config.steps:
        raise ValueError(
            f"{output / CHECKPOINTS} holds step {start}, past steps={config.steps}; ask for steps >= {start}, "
            "or use a new output_dir"
        )
    if start:
        state = {"params": params, "opt_state": opt_state, "step": jnp.int32(0)}
        restored = manager.restore(start, args=ocp.args.StandardRestore(jax.tree.map(_abstract, state)))
        params, opt_state = restored["params"], restored["opt_state"]
    _truncate_log(output / LOG, start)

    # The module the attacks run on: the trained weights (LoRA merged), a copy that shares the frozen arrays.
    current = dataclasses.replace(loaded, model=with_weights(loaded.model, _weights(loaded.model, params, step_config)))
    data = axis_size(loaded.mesh, DATA)
    batch_rows = math.ceil(config.batch_size / data) * data  # rows divide over the data axis; pads count zero
    attack_config = config.attack_config
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=config.steps, initial=start, desc=f"train {canonical(config.attack)}", unit="step")
    try:
        for step in range(start + 1, config.steps + 1):
            began = time.perf_counter()
            rows, orders = [], []
            for index, example_index in enumerate(batch_indices(len(usable), config.batch_size, config.seed, step)):
                example = usable[example_index]
                seed = attack_seed(config.seed, step, index)
                order, row = _adversarial_row(current, example, attack_config, seed, config)
                orders.append(order)
                rows.append(row)
            attack_seconds = time.perf_counter() - began
            batch = place(make_batch(rows, batch_rows), loaded.mesh)
            new_params, new_opt_state, loss, grad_norm = train_step(loaded.model, params, opt_state, batch, step_config)
            loss, grad_norm = float(loss), float(grad_norm)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                good = manager.latest_step()
                kept = f"the last good checkpoint, step {good}, is kept" if good else "no checkpoint was written yet"
                raise FloatingPointError(
                    f"step {step}: the training loss is {loss} and the gradient norm {grad_norm}; training stopped "
                    f"and this step was not saved: {kept} in {output / CHECKPOINTS}. Lower the learning rate "
                    "(or raise warmup_steps) and train into a new output_dir"
                )
            params, opt_state = new_params, new_opt_state
            nnx.update(current.model, _weights(loaded.model, params, step_config))
            jsonl.append(
                output / LOG,
                {
                    "step": step,
                    "examples": [order["id"] for order in orders],
                    "orders": orders,
                    "loss": loss,
                    "grad_norm": grad_norm,
                    "learning_rate": float(learning_rate(settings(step_config), step - 1)),
                    "attack_seconds": attack_seconds,
                    "seconds": time.perf_counter() - began,
                },
            )
            if step % config.checkpoint_every == 0 or step == config.steps:
                state = {"params": params, "opt_state": opt_state, "step": jnp.int32(step)}
                manager.save(step, args=ocp.args.StandardSave(state))
                manager.wait_until_finished()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
    finally:
        if bar is not None:
            bar.close()
        manager.close()

    log = [record for _, record in jsonl.read(output / LOG, "training step")]
    return TrainResult(
        model=current,
        params=params,
        steps=config.steps,
        resumed_from=start,
        losses=tuple(record["loss"] for record in log),
        usable=len(usable),
        skipped=counts,
        fallbacks=sum("fallback" in order for record in log for order in record["orders"]),
        output_dir=output,
    )


def _adversarial_row(
    current: LoadedModel, example: Example, attack_config, seed: int, config: TrainConfig
) -> tuple[dict, tuple[list[int], list[int]]]:
    """The order ``example`` is trained under at this step (the attack's on ``current``'s weights, or the original
    for a clean run) as its log entry, and its training row: the re-rendered prompt's ids and the answer's."""
    table = example.table
    identity = list(range(table.n_rows)), list(range(table.n_cols))
    order = {"id": example.id, "attack_seed": None if config.is_clean else seed, "attack_loss": None}
    row_perm, col_perm = identity
    if not config.is_clean:
        try:
            result = attack(current, example, dataclasses.replace(attack_config, seed=seed), config.style)
            row_perm, col_perm = list(result.row_perm), list(result.col_perm)
            order["attack_loss"] = result.loss
        except (AttackInputError, InputTooLong) as e:  # e.g. KL: the model's clean answer became empty
            order["fallback"] = f"{type(e).__name__}: {e}"
    target = encode_text(current.tokenizer, reference_answer(example))
    prompt = prompt_ids(current, example, table.permute(row_perm, col_perm), config.style)
    try:
        check_context(current, example, len(prompt), len(target))
    except InputTooLong as e:  # the permuted text tokenizes longer than the original, which fits
        order["fallback"] = f"{type(e).__name__}: {e}"
        row_perm, col_perm = identity
        prompt = prompt_ids(current, example, table, config.style)
    order["row_perm"], order["col_perm"] = row_perm, col_perm
    return order, (prompt, target)


def _weights(model, params: dict, config: TrainStepConfig) -> dict:
    """The pure dict of the trained model's weights that differ from ``model``'s: ``params`` themselves (full), or
    the merged layer weights (LoRA), placed as ``model``'s are."""
    if config.lora is None:
        return params
    merged = _merged_layers(model, params, config.lora)
    base = model.layers.weights()
    return {"layers": {name: jax.device_put(value, base[name].sharding) for name, value in merged.items()}}


@functools.partial(jax.jit, static_argnames=("lora",))
def _merged_layers(model, params: dict, lora: LoraConfig) -> dict:
    return trained_model(model, params, TrainStepConfig(lora=lora)).layers.weights()


def _abstract(leaf):
    """A leaf of the state to restore into: its shape, dtype and placement."""
    return ocp.utils.to_shape_dtype_struct(leaf) if isinstance(leaf, jax.Array) else leaf


def checkpointed_step(output_dir: str | os.PathLike, config: TrainConfig) -> int:
    """The step of ``output_dir``'s latest checkpoint, 0 when it has none: ``train`` resumes after it."""
    if not (Path(output_dir) / CHECKPOINTS).is_dir():
        return 0
    manager = _checkpoints(Path(output_dir), config)
    try:
        return manager.latest_step() or 0
    finally:
        manager.close()


def _checkpoints(output: Path, config: TrainConfig) -> ocp.CheckpointManager:
    # Synchronous saves: a step's checkpoint is on disk before the next step starts, so a kill loses at most the
    # steps since the last one. An interrupted save leaves a temporary folder that orbax never lists as a step.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.keep, enable_async_checkpointing=False, create=True, cleanup_tmp_directories=True
    )
    return ocp.CheckpointManager((output / CHECKPOINTS).absolute(), options=options)


def _on_mesh(loaded: LoadedModel, mesh) -> LoadedModel:
    """``loaded`` on ``mesh``: as it is when it lives there already (or no mesh is asked for), else a copy of its
    weights placed there (``atp_jax.models.partitioning``)."""
    if mesh is None or mesh == loaded.mesh:
        return loaded
    if loaded.mesh is not None:
        raise ValueError(
            f"the model lives on another mesh ({dict(loaded.mesh.shape)}) than the one asked for "
            f"({dict(mesh.shape)}); load it with load_model(..., mesh=...) or pass mesh=None"
        )
    shardings = weight_shardings(loaded.config, mesh)
    flat = flatten_dict(nnx.to_pure_dict(nnx.state(loaded.model)), sep=".")
    placed = {field: jax.device_put(value, shardings[field]) for field, value in flat.items()}
    model = with_weights(loaded.model, unflatten_dict(placed, sep="."))
    model.mesh = mesh
    return dataclasses.replace(loaded, model=model)


def _check_manifest(output: Path, loaded: LoadedModel, config: TrainConfig, usable_ids: list[str]) -> None:
    """Writes ``train.json`` for a new run; for a resume, ``ValueError`` naming what differs from it."""
    manifest = {"config": config.identity(), "model": loaded.name, "source": loaded.source, "examples": usable_ids}
    path = output / MANIFEST
    if not path.exists():
        _write_json(path, manifest)
        return
    recorded = json.loads(path.read_text())
    differences = []
    for key in ("model", "source"):
        if recorded.get(key) != manifest[key]:
            differences.append(f"{key} {recorded.get(key)!r} -> {manifest[key]!r}")
    old, new = recorded.get("config", {}), manifest["config"]
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            differences.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    if recorded.get("examples") != usable_ids:
        differences.append(
            f"the usable examples ({len(recorded.get('examples', []))} -> {len(usable_ids)}, or their order)"
        )
    if differences:
        raise ValueError(
            f"{output} holds another training run ({'; '.join(differences)}); train into a new output_dir, or "
            "resume with the same model, examples and settings (checkpoint_every, keep and, under a constant schedule, "
            "steps may change)"
        )


def _truncate_log(path: Path, step: int) -> None:
    """Drops the log's lines past ``step`` (steps run after the last checkpoint, which a resume runs again)."""
    if not path.exists():
        return
    kept = [record for _, record in jsonl.read(path, "training step") if record["step"] <= step]
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in kept))
    os.replace(temporary, path)


def _write_json(path: Path, obj) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    os.replace(temporary, path)


def export(loaded: LoadedModel, trained_params: dict, config: TrainConfig, directory: str | os.PathLike) -> Path:
    """Writes the trained model as a Hugging Face directory that ``load_model(directory)`` (and transformers) read:
    ``config.json``, ``model.safetensors`` (LoRA merged into the kernels) and the tokenizer's files.

    ``loaded`` is the model training started from, ``trained_params`` ``TrainResult.params``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    from safetensors.numpy import save_file

    model = trained_model(loaded.model, trained_params, config.step_config)
    weights = {name: np.ascontiguousarray(value) for name, value in export_hf(model).items()}
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf = loaded.config.to_hf()
    hf["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[loaded.config.architecture]]
    hf["torch_dtype"] = str(np.dtype(loaded.dtype))
    _write_json(directory / "config.json", hf)
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(str(directory))
    return directory
