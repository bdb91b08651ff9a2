"""The package as a user installs it: the wheel built from this checkout, installed non-editable into a fresh venv
with its dependencies pinned by ``constraints/cpu.txt``. Every console script in ``pyproject.toml`` answers
``--help`` with its own binary's docstring, and ``atp-attack`` checks its flags (and finds the bundled sample)
before any model work. Nothing runs from the checkout: the scripts start in an empty folder.

Building and installing take one to two minutes on two cores (the dependencies come from pip's index or cache).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
NO_MODEL = "/nonexistent/model.gguf"


def _run(command, cwd, timeout=900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(JAX_PLATFORMS="cpu", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(
        list(map(str, command)), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding the wheel (not an editable install) and its pinned dependencies; its ``bin/``."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(REPO / "atp_jax", source / "atp_jax", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", source],
        cwd=root,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("atp_jax-*.whl")
    made = _run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    assert made.returncode == 0, made.stderr[-3000:]
    bin_dir = root / "venv" / "bin"
    installed = _run(
        [bin_dir / "python", "-m", "pip", "install", "-q", "-c", REPO / "constraints" / "cpu.txt", wheel], cwd=root
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return bin_dir


def test_the_required_console_scripts_are_declared():
    required = {"atp-attack", "atp-report", "atp-ablate", "atp-transfer", "atp-diagnose", "atp-benchmark"}
    assert required <= set(SCRIPTS)
    assert all(target.startswith("atp_jax.cli.") and target.endswith(":run") for target in SCRIPTS.values())


def test_the_installed_package_is_the_wheel(venv, tmp_path):
    done = _run([venv / "python", "-c", "import atp_jax.cli; print(atp_jax.cli.__file__)"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    site_packages = (venv.parent / "lib").resolve()
    assert Path(done.stdout.strip()).resolve().is_relative_to(site_packages), done.stdout
    shown = _run([venv / "python", "-m", "pip", "show", "atp-jax"], cwd=tmp_path)
    assert "Editable project location" not in shown.stdout, shown.stdout
    assert list((venv.parent / "lib").glob("python3*/site-packages/atp_jax-*.dist-info/licenses/LICENSE"))


def test_every_console_script_answers_help_with_its_docstring(venv, tmp_path):
    """absl prints ``__main__``'s docstring for ``--help``; a console script must show its binary's instead."""
    running = {
        script: subprocess.Popen(
            [venv / script, "--help"],
            cwd=tmp_path,
            env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ""},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in SCRIPTS
    }
    for script, process in running.items():
        stdout, stderr = process.communicate(timeout=300)
        module = SCRIPTS[script].split(":")[0]
        source = (REPO / Path(*module.split("."))).with_suffix(".py")
        first_line = ast.get_docstring(ast.parse(source.read_text())).splitlines()[0]
        assert first_line in stdout, f"{script} --help:\n{stdout[-2000:]}\n{stderr[-2000:]}"
        assert "Traceback" not in stderr, f"{script}: {stderr[-2000:]}"


def test_attack_rejects_a_bad_attack_before_the_model(venv, tmp_path):
    done = _run(
        [venv / "atp-attack", "--model", NO_MODEL, "--attacks", "vanilla,atp_magic", "--output_dir", tmp_path / "o"],
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "unknown attack(s) atp_magic" in done.stderr, done.stderr[-2000:]
    assert "nonexistent/model" not in done.stderr and "Traceback" not in done.stderr


def test_attack_reads_the_bundled_sample_then_names_the_missing_model(venv, tmp_path):
    """The demo's flags pass (the sample questions ship in the wheel); the model is the first thing missing."""
    done = _run([venv / "atp-attack", "--model", NO_MODEL, "--output_dir", tmp_path / "o"], cwd=tmp_path)
    assert done.returncode != 0
    assert NO_MODEL in done.stderr and "--dataset" not in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize(
    "flag, package, install",
    [("--tensorboard_dir", "tensorboardX", "atp-jax[tensorboard]"), ("--wandb_project", "wandb", "pip install wandb")],
)
def test_a_tracking_flag_without_its_package_names_what_to_install(venv, tmp_path, flag, package, install):
    """The base install has neither tracking backend (they are optional): the flag is refused as it is parsed."""
    probe = _run([venv / "python", "-c", f"import {package}"], cwd=tmp_path)
    assert probe.returncode != 0, f"{package} is installed in the fresh venv"
    done = _run([venv / "atp-attack", flag, str(tmp_path / "x"), "--model", NO_MODEL], cwd=tmp_path)
    assert done.returncode != 0
    assert f"{flag}=" in done.stderr and f"needs the {package} package" in done.stderr, done.stderr[-2000:]
    assert install in done.stderr and "nonexistent/model" not in done.stderr, done.stderr[-2000:]
