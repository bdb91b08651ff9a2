"""What a result depends on, named before anything is loaded: the model file's and dataset file's sha256.

These are checked first by every binary, so a bad ``--model`` or ``--dataset`` stops with a message
before minutes of loading, and they enter the run manifest's identity.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from atp_jax.data.datasets import (
    HUB_PREFIX,
    DatasetUnavailableError,
    example_to_dict,
    load_dataset,
    locate_dataset,
)
from atp_jax.models import architectures, hub, zoo
from atp_jax.runs.manifest import sha256_file, sha256_files

_HF_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def model_fingerprint(spec: str) -> dict:
    """``{"model", "model_sha256"}`` of a ``--model`` value; ``ValueError`` naming what it accepts.

    Zoo names are pinned by sha256; a ``.gguf`` file is hashed; an HF directory (a hub id's too, fetched
    first) by its config, tokenizer and safetensors files; a ``config:`` architecture (random weights) by its
    config.
    """
    spec = str(spec)
    if spec.startswith(architectures.CONFIG_PREFIX):
        config = architectures.hf_config(spec.removeprefix(architectures.CONFIG_PREFIX))
        return {"model": spec, "model_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()}
    if spec in zoo.list_models():
        return {"model": spec, "model_sha256": zoo.model_spec(spec).sha256}
    path = Path(spec).expanduser()
    name = path.name
    if hub.is_hub_id(spec):  # named by its id; fetched now, so that an unreachable hub stops the run here
        path, name = hub.fetch(spec), spec
    if path.is_file() and path.suffix == ".gguf":
        return {"model": name, "model_sha256": sha256_file(path)}
    if path.is_dir() and (path / "config.json").is_file():
        names = [n for n in _HF_FILES if (path / n).is_file()] + sorted(p.name for p in path.glob("*.safetensors"))
        if not any(n.endswith(".safetensors") for n in names):
            raise ValueError(f"--model {spec}: an HF model directory needs *.safetensors weights beside config.json")
        return {"model": name, "model_sha256": sha256_files(path, names)}
    raise ValueError(
        f"--model {spec}: not a zoo name ({', '.join(zoo.list_models())}), a .gguf file, an HF model directory "
        f"with config.json, a Hugging Face Hub id (org/name) or {architectures.CONFIG_PREFIX}<name> "
        f"({', '.join(architectures.list_architectures())})"
    )


def examples_sha256(examples) -> str:
    """One digest over examples as JSONL records (their content, where no file holds them: hub datasets)."""
    digest = hashlib.sha256()
    for example in examples:
        digest.update(json.dumps(example_to_dict(example), sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def dataset_fingerprint(dataset: str, split: str = "dev", data_dir: str | os.PathLike | None = None) -> dict:
    """``{"dataset", "split", "dataset_sha256"}``; the files' location is not part of it, their content is:
    a JSONL file's sha256, one digest over every file of an official release the split reads, or for a
    ``hf:`` dataset the digest of its examples (loaded from the hub's local cache)."""
    if str(dataset).startswith(HUB_PREFIX):
        digest = examples_sha256(load_dataset(dataset, split, data_dir))
        return {"dataset": str(dataset), "split": split, "dataset_sha256": digest}
    try:
        source = locate_dataset(dataset, split, data_dir)
    except DatasetUnavailableError as e:
        raise ValueError(f"--dataset {dataset} (split {split}): {e}") from None
    except ValueError as e:
        raise ValueError(f"--dataset {dataset}: {e}") from None
    if source.release is None:
        if not source.path.is_file():
            raise ValueError(f"--dataset {dataset} (split {split}): {source.path} does not exist")
        digest = sha256_file(source.path)
    else:
        folder, names = source.files()
        missing = [name for name in names if not (folder / name).is_file()]
        if missing:
            raise ValueError(
                f"--dataset {dataset} (split {split}): {folder / missing[0]} is missing"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; use a complete checkout"
            )
        digest = sha256_files(folder, names)
    return {"dataset": str(dataset), "split": split, "dataset_sha256": digest}
