"""The flags the experiment binaries share, the selection they make, and the results folder they open.

A binary calls ``define_flags(...)`` (selection, sharding) and ``define_run_flags(...)`` (model, output
folder, restart, memory budget; with ``tracking`` also TensorBoard and W&B) at import with its own defaults,
``examples(...)`` in main, and ``open_folder(...)`` and ``open_sinks(...)`` before it loads a model: the manifest
then says which examples and which model and dataset files made the records, a resume under another identity stops
with one message, and so does a tracking flag whose package is missing.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from absl import flags, logging

from atp_jax.cli import model_flags
from atp_jax.cli.model_flags import define_model_flags
from atp_jax.compilation import compile_totals, disable_persistent_cache, enable_persistent_cache
from atp_jax.data.datasets import DatasetUnavailableError
from atp_jax.data.order_filter import DEFAULT_ORDER_FILTER, ORDER_FILTERS
from atp_jax.distributed import MODES
from atp_jax.runs.experiment import environment, memory_budget_bytes, select_examples
from atp_jax.runs.fingerprints import dataset_fingerprint, model_fingerprint
from atp_jax.runs.manifest import ManifestMismatch, ResultsFolder, provenance
from atp_jax.runs.tracking import (
    TENSORBOARD,
    WANDB,
    RecordSink,
    TensorBoardSink,
    TrackingError,
    WandbSink,
    installed,
    missing_message,
)
from atp_jax.tables.buckets import DEFAULT_BUCKETS, BucketGrid
from atp_jax.tables.table import Example

FLAGS = flags.FLAGS


def define_flags(num_examples: int, max_rows: int = 12, max_cols: int = 8, sharding: bool = True) -> None:
    """``--dataset --data_dir --split --num_examples --filter_order_sensitive --order_filter --max_rows
    --max_cols``, and with ``sharding`` ``--process_index --process_count --distributed``."""
    flags.DEFINE_string("dataset", "sample", "sample | wtq | tatqa | fetaqa | path.jsonl | hf:<hub id>")
    flags.DEFINE_string(
        "data_dir",
        None,
        "Folder with wtq/, tatqa/, fetaqa/ JSONL, or a checkout of the dataset's official repository (or the "
        "folder holding it) (default: $ATP_JAX_DATA).",
    )
    flags.DEFINE_string("split", "dev", "Dataset split.")
    flags.DEFINE_integer("num_examples", num_examples, "Examples (after filtering), 0 for all.")
    flags.DEFINE_bool(
        "filter_order_sensitive",
        True,
        "Drop questions whose answer depends on the table's order "
        "(decided by --order_filter): a permutation must not change the correct answer.",
    )
    flags.DEFINE_enum(
        "order_filter",
        DEFAULT_ORDER_FILTER,
        list(ORDER_FILTERS),
        "How --filter_order_sensitive "
        "finds order-dependent questions: classifier (the question and the table: 'listed last', "
        "'the row after X' where no rank/number/date column orders X) or keywords (the paper's rule: "
        "any of first/last/top/next/previous/above/below/before/after).",
    )
    flags.DEFINE_integer("max_rows", max_rows, "Skip tables with more data rows.")
    flags.DEFINE_integer("max_cols", max_cols, "Skip tables with more columns.")
    flags.DEFINE_list("ids", [], "Only the questions of these ids (after the filters, in the dataset's order).")
    if sharding:
        flags.DEFINE_integer("process_index", None, "This process's shard (default: jax.process_index()).")
        flags.DEFINE_integer("process_count", None, "Number of shards (default: jax.process_count()).")
        flags.DEFINE_enum(
            "distributed",
            "auto",
            list(MODES),
            "Join jax.distributed: auto (when SLURM/TPU-slice/JAX_COORDINATOR_ADDRESS says so), on, off.",
        )


def examples(process_index: int = 0, process_count: int = 1) -> list[Example]:
    """This process's examples under the flags; a bad dataset or shard exits with one message."""
    try:
        return select_examples(
            FLAGS.dataset,
            FLAGS.split,
            FLAGS.data_dir,
            FLAGS.num_examples,
            FLAGS.filter_order_sensitive,
            FLAGS.max_rows,
            FLAGS.max_cols,
            process_index,
            process_count,
            order_filter=FLAGS.order_filter,
            ids=FLAGS.ids,
        )
    except (OSError, ValueError, DatasetUnavailableError) as e:
        sys.exit(f"--dataset {FLAGS.dataset}: {e}")


def manifest() -> dict:
    """The selection flags, for a run manifest: which questions were dropped, and by which order rule."""
    return {
        "dataset": FLAGS.dataset,
        "split": FLAGS.split,
        "data_dir": FLAGS.data_dir,
        "num_examples": FLAGS.num_examples,
        "filter_order_sensitive": FLAGS.filter_order_sensitive,
        "order_filter": FLAGS.order_filter,
        "max_rows": FLAGS.max_rows,
        "max_cols": FLAGS.max_cols,
        **({"ids": FLAGS.ids} if FLAGS.ids else {}),  # only when set: earlier folders keep their identity
    }


def define_run_flags(model: str, output_dir: str, memory_budget: bool = True, tracking: bool = False) -> None:
    """``--model --dtype --tokenizer --mesh`` (``atp_jax.cli.model_flags``), ``--output_dir --restart`` (and with
    ``memory_budget`` ``--memory_budget_gb``, with ``tracking`` ``--tensorboard_dir --wandb_project``), with this
    binary's defaults."""
    define_model_flags(model)
    flags.DEFINE_string("output_dir", output_dir, "Where this run's records, run.json and flags.txt go.")
    flags.DEFINE_bool(
        "restart",
        False,
        "When --output_dir holds records of another model, dataset, style, seed or "
        "configuration: set them aside (renamed, never deleted) and start over. Without it such a "
        "resume is refused.",
    )
    flags.DEFINE_bool(
        "compilation_cache",
        True,
        "Keep compiled XLA programs on disk (JAX's persistent compilation cache) so reruns and resumes skip "
        "compiles they did before: $JAX_COMPILATION_CACHE_DIR if set, else <atp_jax cache>/xla; "
        "--nocompilation_cache turns it off, $JAX_COMPILATION_CACHE_DIR too.",
    )
    if tracking:
        flags.DEFINE_string(
            "tensorboard_dir",
            None,
            "Also write each record's metrics and each attack's trace as TensorBoard event files here "
            "(tensorboard --logdir DIR); needs tensorboardX: pip install 'atp-jax[tensorboard]'.",
        )
        flags.DEFINE_string(
            "wandb_project",
            None,
            "Also log each record to this Weights & Biases project, one run per process; needs wandb "
            "(pip install wandb) and a login, or WANDB_MODE=offline.",
        )
        # A missing package stops the binary while it parses its flags, before anything else runs.
        for flag, (package, install) in (("tensorboard_dir", TENSORBOARD), ("wandb_project", WANDB)):
            flags.register_validator(
                flag,
                lambda value, package=package: value is None or installed(package),
                missing_message(package, install),
            )
    if memory_budget:
        flags.DEFINE_float(
            "memory_budget_gb",
            None,
            "Skip (and record why) examples whose attention weights alone would "
            "need more memory than this; default: half of this machine's memory.",
        )


def define_bucket_flags() -> None:
    """``--buckets``, ``--bucket_steps``, ``--candidate_batch`` and ``--batch_examples``: the shape buckets attack
    problems are padded to, and how many orders and questions one program computes."""
    flags.DEFINE_bool(
        "buckets",
        True,
        "Pad each question's attack tensors to a shape bucket (atp_jax.tables.buckets), so questions of one "
        "bucket share compiled programs; --nobuckets keeps every question's exact sizes (one compile per shape). "
        "Results are the same either way, so this is not part of a results folder's identity.",
    )
    flags.DEFINE_integer(
        "candidate_batch",
        DEFAULT_BUCKETS.candidate_batch,
        "With --buckets: orders scored per forward, every batch of two or more padded to it (a single order is "
        "scored alone; on a CPU, 1 runs searches fastest, since a padded batch computes every slot; on an "
        "accelerator 32 scores best-of-20 in one forward).",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "bucket_steps",
        2,
        "With --buckets: rungs per octave of the prompt's lengths (body, prefix, re-rendered text), from 64. "
        "2 pads a length by at most 50% (about 20% on average); 4 by at most 25%, for about a third more buckets "
        "(programs) on a sweep: less padded compute, which is what counts on a CPU. A divisor of 64.",
        lower_bound=1,
    )
    flags.register_validator(
        "bucket_steps",
        lambda steps: 64 % steps == 0,
        message="--bucket_steps must divide 64 (1, 2, 4, 8, 16, 32 or 64) so that every rung is a whole length",
    )
    flags.DEFINE_integer(
        "batch_examples",
        1,
        "Attack this many questions of one shape bucket at once, each attack vmapped over them (best-of-k, "
        "evolution, ATP, search alike) and their answers generated in one batch: what keeps a GPU or TPU busy. "
        "The records are the same as one at a time, so this is not part of a results folder's identity; on a "
        "CPU, 1 is as fast.",
        lower_bound=1,
    )


def bucket_grid() -> BucketGrid | None:
    """The grid ``--buckets``/``--bucket_steps``/``--candidate_batch`` ask for; None for exact shapes."""
    if not FLAGS.buckets:
        return None
    return BucketGrid(candidate_batch=FLAGS.candidate_batch).with_length_steps(FLAGS.bucket_steps)


def start_compilation() -> None:
    """Starts counting compiles and, with ``--compilation_cache``, turns the persistent cache on (before any
    compile: JAX decides once whether a process uses it)."""
    compile_totals()
    if FLAGS.compilation_cache:
        enable_persistent_cache()
    else:
        disable_persistent_cache()


def memory_budget() -> int:
    """``--memory_budget_gb`` in bytes (default: half of this machine's memory)."""
    return memory_budget_bytes(FLAGS.memory_budget_gb)


def writable_folder(folder: Path) -> Path:
    """``folder``, created; exits with one message if it cannot be created or written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        sys.exit(f"--output_dir {folder} is not a writable folder ({e.strerror or e}); choose another")
    return folder


def open_folder(
    identity: Mapping,
    attacks: Mapping[str, dict],
    num_examples: int,
    *,
    folder: Path | None = None,
    process_index: int = 0,
    process_count: int = 1,
    model_identity: Mapping | None = None,
) -> ResultsFolder:
    """The results folder (``--output_dir`` unless ``folder``), its manifest checked and written.

    The identity is the model's and dataset's fingerprints plus ``identity`` (style, seed, metrics, …);
    ``model_identity`` replaces the model's part (a server victim names itself). A bad ``--model``/``--dataset``
    or a resume that would mix configurations exits with the reason. Call it before loading the model: it fails
    in a second, not after minutes of loading.
    """
    start_compilation()
    results = ResultsFolder(writable_folder(Path(folder or FLAGS.output_dir)), process_index, process_count)
    try:
        if model_identity is None:
            model_identity = {**model_fingerprint(FLAGS.model), **model_flags.identity()}
        full_identity = {
            **model_identity,
            **dataset_fingerprint(FLAGS.dataset, FLAGS.split, FLAGS.data_dir),
            **identity,
        }
        results.begin(
            full_identity,
            attacks,
            provenance(sys.argv),
            flags_text=FLAGS.flags_into_string(),
            restart=FLAGS.restart,
            # where the model was loaded from (not identity: a moved file is the same model), for transfer.py
            extra={
                "examples": num_examples,
                "selection": manifest(),
                "model_source": FLAGS.model,
                **model_flags.manifest(model_flags.check_model_flags()),
                **environment(),
            },
        )
    except (ManifestMismatch, ValueError) as e:
        sys.exit(str(e))
    return results


def open_sinks(config: Mapping, process_index: int = 0, process_count: int = 1) -> list[RecordSink]:
    """The sinks ``--tensorboard_dir`` and ``--wandb_project`` ask for (``config``: what W&B shows of the run);
    a missing package or a folder that cannot be written exits with one message. Call it before loading the model."""
    sinks = []
    try:
        if FLAGS.tensorboard_dir:
            sink = TensorBoardSink(FLAGS.tensorboard_dir, process_index, process_count)
            logging.info(
                "TensorBoard event files in %s (view: tensorboard --logdir %s)", sink.scalars_dir, sink.directory
            )
            sinks.append(sink)
        if FLAGS.wandb_project:
            sinks.append(WandbSink(FLAGS.wandb_project, FLAGS.output_dir, config, process_index, process_count))
    except TrackingError as e:
        sys.exit(str(e))
    except OSError as e:
        sys.exit(
            f"--tensorboard_dir {FLAGS.tensorboard_dir} is not a writable folder ({e.strerror or e}); choose another"
        )
    return sinks
