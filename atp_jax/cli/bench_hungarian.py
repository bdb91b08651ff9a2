"""Median time of the hard projection, host (SciPy callback) vs device (optax Hungarian), under jit.

Usage:
  atp-bench-hungarian [--batch_sizes=1,4,16] [--ks=5,10,30] [--num_runs=9]

Each (R, k) case projects a [R, k, k] batch of Sinkhorn outputs with `jit(vmap(project))`. Both methods
are compiled and warmed up first, then timed alternately in the same process (host, device, host, ...)
so that drifting machine load hits both alike; the table gives the median of --num_runs runs.
"""

import functools
import statistics
import time

import jax
import numpy as np
from absl import flags

from atp_jax.attack.hungarian import project
from atp_jax.attack.sinkhorn import sinkhorn
from atp_jax.cli.console import run_app

_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "4", "16"], "Restart counts R.")
_KS = flags.DEFINE_list("ks", ["5", "10", "30"], "Matrix sizes k.")
_NUM_RUNS = flags.DEFINE_integer("num_runs", 9, "Timed runs per method and case (median reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed runs after compilation.")
_SCALE = flags.DEFINE_float("scale", 2.0, "theta = scale * N(0, 1) before Sinkhorn.")


def _timed(fn, x):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(x))
    return time.perf_counter() - t0


def main(argv):
    del argv
    assert _NUM_RUNS.value >= 7, "medians of at least 7 runs"
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, device {jax.devices()[0]}")
    fns = {m: jax.jit(jax.vmap(functools.partial(project, method=m))) for m in ("host", "device")}
    print(
        f"{'R':>3} {'k':>3} | {'host ms':>9} {'device ms':>10} | {'device/host':>11} | "
        f"{'compile host s':>14} {'compile device s':>16}"
    )
    key = jax.random.PRNGKey(0)
    for k in map(int, _KS.value):
        for r in map(int, _BATCH_SIZES.value):
            key, sub = jax.random.split(key)
            D = jax.block_until_ready(sinkhorn(_SCALE.value * jax.random.normal(sub, (r, k, k))))
            compile_s, outs = {}, {}
            for m, fn in fns.items():
                compile_s[m] = _timed(fn, D)  # first call: trace + compile + run
                outs[m] = np.asarray(fn(D))
                for _ in range(_WARMUP.value):
                    _timed(fn, D)
            # Sanity: both reach the same optimum (they may differ only on exact ties).
            scores = {m: np.take_along_axis(np.asarray(D), o[..., None], -1).sum((-2, -1)) for m, o in outs.items()}
            assert np.allclose(scores["host"], scores["device"], atol=1e-4), scores
            times = {m: [] for m in fns}
            for _ in range(_NUM_RUNS.value):
                for m, fn in fns.items():  # alternate the methods within the same process
                    times[m].append(_timed(fn, D))
            med = {m: 1e3 * statistics.median(t) for m, t in times.items()}
            print(
                f"{r:>3} {k:>3} | {med['host']:>9.3f} {med['device']:>10.3f} | "
                f"{med['device'] / med['host']:>11.2f} | {compile_s['host']:>14.2f} "
                f"{compile_s['device']:>16.2f}"
            )


def run() -> None:
    """The console script ``atp-bench-hungarian``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
