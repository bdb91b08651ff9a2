"""A results folder owns its on-disk schema: the records, the manifest, the flags that made them.

``OUTPUT_DIR/results.jsonl`` (``results.shardK.jsonl`` for process K of several) holds one record per
(example id, attack spec); ``run.json`` (``run.shardK.json``) the manifest; ``flags.txt``
(``flags.shardK.txt``) the binary's full flags as an absl flagfile, so ``--flagfile`` replays the run.

A manifest has three parts. The *identity* keys (listed under ``identity_keys``, stored at the top
level where readers look for ``model``, ``dataset``, ``style``) say what every record depends on — the
model and the sha256 of its file, the dataset and the sha256 of its file, the prompt style, the seed,
the metrics, … — and a resume whose identity differs is refused: its records would silently mix.
``attacks`` maps each recorded attack spec to its full configuration; a spec may be added to a folder
(more attacks on the same examples), never redefined. ``provenance`` lists, per session that wrote to
the folder, the package versions that shape a number, the git revision and the command line: recorded,
not compared, so a resume after an upgrade is allowed and visible. A session that adds nothing to the manifest
records itself with its first record, so a rerun that finds every record done leaves the folder as it was.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from atp_jax.attack import registry
from atp_jax.runs.records import append_record, done_keys

MANIFEST_VERSION = 2
# Every package whose version can change a recorded number.
VERSIONED_PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "numpy",
    "scipy",
    "transformers",
    "tokenizers",
    "gguf",
    "atp-jax",
)
_HASH_CHUNK = 1 << 20


class ManifestMismatch(ValueError):
    """A resume into a folder whose records were made under another identity or configuration."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(root: Path, names: list[str]) -> str:
    """One digest over named files of a folder (name and content of each, in sorted order)."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode() + b"\0" + sha256_file(root / name).encode() + b"\0")
    return digest.hexdigest()


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision() -> str | None:
    """The checkout's commit (with ``-dirty`` when it has uncommitted changes), or None outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty else "")


def provenance(argv: list[str]) -> dict:
    """What one session that writes to a folder records about itself (not compared on resume)."""
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": package_versions(),
        "python": platform.python_version(),
        "git_revision": git_revision(),
        "argv": list(argv),
    }


def _differences(old: Mapping, new: Mapping, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: recorded {a!r}, this run {b!r}")
    return out


@dataclasses.dataclass(frozen=True)
class ResultsFolder:
    """One process's view of a results folder (``process_index`` of ``process_count``)."""

    path: Path
    process_index: int = 0
    process_count: int = 1
    records: str = "results"  # the records' file stem: ``results`` for attacks, ``pairs`` for diagnoses
    # The manifest and flags ``begin`` held back until the session writes something (see ``record_session``).
    _pending: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def _name(self, stem: str, suffix: str) -> Path:
        shard = "" if self.process_count == 1 else f".shard{self.process_index}"
        return Path(self.path) / f"{stem}{shard}{suffix}"

    @property
    def results_file(self) -> Path:
        return self._name(self.records, ".jsonl")

    @property
    def manifest_file(self) -> Path:
        return self._name("run", ".json")

    @property
    def flags_file(self) -> Path:
        return self._name("flags", ".txt")

    @staticmethod
    def shard_files(path: str | os.PathLike, stem: str, suffix: str) -> list[Path]:
        """``<stem><suffix>`` then ``<stem>.shardK<suffix>`` by K: one kind of file of every process of a folder."""
        folder = Path(path)
        prefix = f"{stem}.shard"
        shards = []
        for file in folder.glob(f"{prefix}*{suffix}"):
            index = file.name[len(prefix) : len(file.name) - len(suffix)]
            if index.isdigit():
                shards.append((int(index), file))
        single = folder / f"{stem}{suffix}"
        return ([single] if single.is_file() else []) + [file for _, file in sorted(shards)]

    @classmethod
    def record_files(cls, path: str | os.PathLike) -> list[Path]:
        """Every process's results file of the folder at ``path``."""
        return cls.shard_files(path, "results", ".jsonl")

    @classmethod
    def manifest_files(cls, path: str | os.PathLike) -> list[Path]:
        """Every process's manifest of the folder at ``path``."""
        return cls.shard_files(path, "run", ".json")

    def read_manifest(self) -> dict | None:
        if not self.manifest_file.exists():
            return None
        return json.loads(self.manifest_file.read_text())

    def begin(
        self,
        identity: dict,
        attacks: Mapping[str, dict],
        session: dict,
        *,
        flags_text: str | None = None,
        restart: bool = False,
        extra: Mapping | None = None,
    ) -> dict:
        """Checks this run against the folder's manifest and writes the merged manifest (and flags).

        When the folder's manifest already says everything but this session's provenance (a resume with nothing
        new), the write waits for ``record_session`` — which ``append`` calls before the first record — so a
        session that writes no record leaves the folder untouched.

        Raises ``ManifestMismatch`` naming each difference and the two ways out (a new folder, or
        ``restart=True``, which sets the old records and manifest aside under a ``.replaced-<time>``
        suffix — they are never deleted) when the folder holds records of another identity, or an attack
        spec it already records with another configuration.
        """
        Path(self.path).mkdir(parents=True, exist_ok=True)
        old = self.read_manifest()
        has_records = self.results_file.exists() and self.results_file.stat().st_size > 0
        if restart and (old is not None or has_records):
            stamp = time.strftime("%Y%m%dT%H%M%S")
            for file in (self.results_file, self.manifest_file, self.flags_file):
                if file.exists():
                    file.rename(file.with_name(f"{file.name}.replaced-{stamp}"))
            old, has_records = None, False
        if old is not None or has_records:
            self._check(old, identity, attacks)
        merged_attacks = {**(old or {}).get("attacks", {}), **attacks}
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            **identity,
            "identity_keys": sorted(identity),
            "attacks": merged_attacks,
            **(extra or {}),
            "process_index": self.process_index,
            "process_count": self.process_count,
            "provenance": [*(old or {}).get("provenance", []), session],
        }
        self._pending.clear()
        if old is not None and _without_provenance(old) == _without_provenance(manifest):
            self._pending.update(manifest=manifest, flags_text=flags_text)
        else:
            self._write(manifest, flags_text)
        return manifest

    def record_session(self) -> None:
        """Writes the manifest ``begin`` held back (this session's provenance, and its flags); a no-op otherwise.
        Call it when a session does work that is not a record (training steps); ``append`` calls it itself."""
        if self._pending:
            manifest, flags_text = self._pending.pop("manifest"), self._pending.pop("flags_text")
            self._write(manifest, flags_text)

    def _write(self, manifest: dict, flags_text: str | None) -> None:
        tmp = self.manifest_file.with_name(self.manifest_file.name + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2))
        os.replace(tmp, self.manifest_file)  # a killed start leaves the old manifest or the new one
        if flags_text is not None:
            self.flags_file.write_text(flags_text)

    def _check(self, old: dict | None, identity: dict, attacks: Mapping[str, dict]) -> None:
        fix = (
            f"write this run to a new --output_dir, or pass --restart to set {self.path}'s records aside and start over"
        )
        if old is None or old.get("manifest_version") != MANIFEST_VERSION:
            raise ManifestMismatch(
                f"{self.path} holds records without a version-{MANIFEST_VERSION} manifest "
                f"({self.manifest_file.name} missing or older), so what made them is unknown; "
                f"{fix}"
            )
        recorded_keys = set(old.get("identity_keys", ())) | set(identity)
        problems = _differences(
            {k: old.get(k, "<absent>") for k in recorded_keys}, {k: identity.get(k, "<absent>") for k in recorded_keys}
        )
        recorded = old.get("attacks", {})
        problems += [
            f"attack {name}: recorded {recorded[name]}, this run {config}"
            for name, config in attacks.items()
            if name in recorded and not same_attack_config(recorded[name], config)
        ]
        if problems:
            raise ManifestMismatch(
                f"{self.manifest_file}: this run differs from the records there —\n  "
                + "\n  ".join(problems)
                + f"\n{fix}"
            )

    def done_keys(self) -> set[tuple[str, str]]:
        return done_keys([self.results_file])

    def append(self, record) -> None:
        """Appends one record (an ``AttackRecord``/``SkipRecord`` or a plain dict) atomically."""
        self.record_session()
        append_record(self.results_file, record)


def _without_provenance(manifest: Mapping) -> dict:
    # Through JSON, as the folder's copy was: a tuple here is the list there.
    return json.loads(json.dumps({key: value for key, value in manifest.items() if key != "provenance"}))


def same_attack_config(recorded: Mapping, current: Mapping) -> bool:
    """Whether a recorded attack configuration is the current one: equal, or equal but for fields its method
    gained since the record was made, now at their defaults (a new field's default keeps the behaviour from
    before it existed, so the records still describe this configuration)."""
    if recorded == current:
        return True
    added = set(current) - set(recorded)
    if set(recorded) - set(current) or any(recorded[k] != current[k] for k in recorded) or not added:
        return False
    try:
        fields = {f.name: f.default for f in dataclasses.fields(registry.method(current.get("method", "")).config)}
    except ValueError:
        return False
    return all(k in fields and current[k] == fields[k] for k in added)
