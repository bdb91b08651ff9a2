"""atp-bucket-grid counts the buckets a sweep meets; finer rungs can only split buckets and pad less.

The 1-step rungs of a length (64, 128, 256, …) are a subset of the 2-step ones (64, 96, 128, 192, …), which are
a subset of the 4-step ones, so a coarser grid's bucket is a function of a finer grid's: it meets at most as
many buckets, never fewer tokens.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args):
    env = {k: v for k, v in os.environ.items() if k != "ATP_JAX_DATA"}
    command = [sys.executable, "-m", "atp_jax.cli.bucket_grid", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_sample_sweep_needs_no_data_folder_and_finer_rungs_split_buckets():
    done = _run("--datasets", "sample", "--models", "smollm2-135m-instruct", "--sweep", "24")
    assert done.returncode == 0, done.stderr[-2000:]
    row = re.search(
        r"^\| sample \| (\d+) \| (\d+) \| (\d+) \(([\d.]+)\) \| (\d+) \(([\d.]+)\) \| (\d+) \(([\d.]+)\) \|$",
        done.stdout,
        re.MULTILINE,
    )
    assert row, done.stdout[-2000:]
    questions, exact, b1, r1, b2, r2, b4, r4 = (float(x) for x in row.groups())
    assert questions == 24
    assert b1 <= b2 <= b4 <= exact
    assert r1 >= r2 >= r4 >= 1.0
    assert b4 > b1 and r1 > r4  # the steps reach the grid: a sweep of 24 tables is not all on shared rungs


def test_named_dev_set_without_a_data_folder_is_refused():
    done = _run("--datasets", "sample,wtq", "--models", "smollm2-135m-instruct")
    assert done.returncode != 0
    assert "--data_dir: give the folder holding wtq/" in done.stderr, done.stderr[-2000:]
