"""Reading a results folder back: every shard's records merged (one per (id, attack)) and its manifest."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path

from atp_jax.runs.manifest import ResultsFolder
from atp_jax.runs.records import read_records


def results_files(folder: str | os.PathLike) -> list[Path]:
    """``results.jsonl`` then ``results.shardK.jsonl`` by K: the record files of one results folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"results folder {folder} does not exist; pass the --output_dir of a run")
    files = ResultsFolder.record_files(folder)
    if not files:
        raise FileNotFoundError(
            f"no results.jsonl or results.shard*.jsonl in {folder}; pass the --output_dir "
            "of run_attack.py, ablate.py or transfer.py"
        )
    return files


def merge_records(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """The records of ``paths`` in order, one per (id, attack): the first occurrence wins (a shard rerun
    under another process count may record a pair again), except that a skip marked ``retry`` (a victim server
    that was down) gives way to the pair's next record."""
    merged: dict[tuple[str, str], dict] = {}
    for path in paths:
        for record in read_records(path):
            key = (record["id"], record["attack"])
            if key not in merged or merged[key].get("retry"):
                merged[key] = record
    return list(merged.values())


@dataclasses.dataclass(frozen=True)
class Run:
    """One results folder: its manifest (``run.json``, or the first shard's) and merged records."""

    folder: Path
    manifest: dict
    records: list[dict]

    @property
    def model(self) -> str:
        return self.manifest["model"]

    @property
    def dataset(self) -> str:
        return self.manifest.get("dataset", "?")


def load_manifest(folder: str | os.PathLike) -> dict:
    """``run.json``, or ``run.shardK.json`` of the lowest K; every shard must name the same model/dataset."""
    folder = Path(folder)
    paths = ResultsFolder.manifest_files(folder)
    if not paths:
        raise FileNotFoundError(
            f"no run.json or run.shard*.json in {folder}: the manifest names the model; "
            'rerun the binary that wrote the results, or write one with a "model" key'
        )
    manifests = [json.loads(p.read_text()) for p in paths]
    for path, manifest in zip(paths, manifests):
        if "model" not in manifest:
            raise ValueError(f'{path} has no "model" key; add the model\'s name to it')
        for key in ("model", "dataset"):
            if manifest.get(key) != manifests[0].get(key):
                raise ValueError(
                    f"{path} says {key}={manifest.get(key)!r} but {paths[0]} says "
                    f"{manifests[0].get(key)!r}: one folder must hold one run; move it out"
                )
    return manifests[0]


def load_run(folder: str | os.PathLike) -> Run:
    """Manifest and merged records (all shards, first (id, attack) kept) of one results folder."""
    records = merge_records(results_files(folder))  # first: its error says whether the folder exists
    return Run(Path(folder), load_manifest(folder), records)
