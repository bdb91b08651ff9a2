"""The example-selection and sharding flags the experiment binaries share, and the selection they make.

A binary calls ``define_flags(...)`` at import (with its own defaults), ``examples(...)`` in main, and
records ``manifest()`` in its run manifest, so a result says which examples it was run on.
"""

from __future__ import annotations

import sys

from absl import flags

from atp_jax.data.order_filter import DEFAULT_ORDER_FILTER, ORDER_FILTERS
from atp_jax.distributed import MODES
from atp_jax.runs.experiment import select_examples
from atp_jax.tables.table import Example

FLAGS = flags.FLAGS


def define_flags(num_examples: int, max_rows: int = 12, max_cols: int = 8, sharding: bool = True) -> None:
    """``--dataset --data_dir --split --num_examples --filter_order_sensitive --order_filter --max_rows
    --max_cols``, and with ``sharding`` ``--process_index --process_count --distributed``."""
    flags.DEFINE_string("dataset", "sample", "sample | wtq | tatqa | fetaqa | path.jsonl")
    flags.DEFINE_string("data_dir", None, "Folder with wtq/, tatqa/, fetaqa/ (default: $ATP_JAX_DATA).")
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
        )
    except (OSError, ValueError) as e:
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
    }
