"""A method added from outside the package — this module — runs through the experiment binary.

The binary imports this module (``--attack_modules test_registry``), which registers the method and a
preset for it; the run records it under its name, and the recorded order is the one the method chose.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from atp_jax.attack import registry
from atp_jax.attack.config import AttackConfig
from atp_jax.attack.presets import attack_names, preset, register_preset

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class RotateRowsConfig(AttackConfig):
    """Data rows rotated by ``shift`` (one query)."""

    method: ClassVar[str] = "rotate_rows"
    shift: int = 1


def run_rotate_rows(evaluator, config, rng):
    rows, cols = evaluator.identity
    rows = np.roll(rows, config.shift)
    evaluator.losses(rows, cols)
    return evaluator.result(config.method, rows, cols)


registry.register(RotateRowsConfig, run_rotate_rows)
register_preset("rotate_rows", RotateRowsConfig())


def test_a_registered_method_is_an_attack_like_any_other():
    assert "rotate_rows" in registry.methods()
    assert preset("rotate_rows@shift=2") == RotateRowsConfig(shift=2)
    assert attack_names(["rotate_rows@shift=1", "rotate_rows@shift=2"]) == ["rotate_rows", "rotate_rows@shift=2"]
    with pytest.raises(ValueError, match="already registered"):
        registry.register(
            dataclasses.make_dataclass("Other", [], bases=(RotateRowsConfig,), frozen=True), run_rotate_rows
        )


def test_the_binary_runs_a_method_registered_by_this_module(tiny_checkpoint, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO)]))
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.run_attack",
        "--model",
        str(tiny_checkpoint),
        "--dataset",
        "sample",
        "--num_examples",
        "1",
        "--nogenerate",
        "--attack_modules",
        "test_registry",
        "--attacks",
        "vanilla,rotate_rows@shift=2",
        "--output_dir",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["attack"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert set(records) == {"vanilla", "rotate_rows@shift=2"}
    rotated = records["rotate_rows@shift=2"]
    n = len(rotated["row_perm"])
    assert rotated["row_perm"] == list(np.roll(np.arange(n), 2)) and rotated["queries"] == 1
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["attacks"]["rotate_rows@shift=2"] == {
        "method": "rotate_rows",
        "mode": "joint",
        "objective": "ce",
        "seed": 0,
        "shift": 2,
    }
