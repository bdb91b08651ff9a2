"""What a result depends on, named before anything is loaded: the model file's and dataset file's sha256.

These are checked first by every binary, so a bad ``--model`` or ``--dataset`` stops with a message
before minutes of loading, and they enter the run manifest's identity.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from pathlib import Path

from atp_jax.data.datasets import DATA_ENV_VAR, dataset_choices
from atp_jax.models import architectures, zoo
from atp_jax.runs.manifest import sha256_file, sha256_files

_HF_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def model_fingerprint(spec: str) -> dict:
    """``{"model", "model_sha256"}`` of a ``--model`` value; ``ValueError`` naming what it accepts.

    Zoo names are pinned by sha256; a ``.gguf`` file is hashed; an HF directory by its config, tokenizer
    and safetensors files; a ``config:`` architecture (random weights) by its config.
    """
    spec = str(spec)
    if spec.startswith(architectures.CONFIG_PREFIX):
        config = architectures.hf_config(spec.removeprefix(architectures.CONFIG_PREFIX))
        return {"model": spec, "model_sha256": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()}
    if spec in zoo.list_models():
        return {"model": spec, "model_sha256": zoo.model_spec(spec).sha256}
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return {"model": path.name, "model_sha256": sha256_file(path)}
    if path.is_dir() and (path / "config.json").is_file():
        names = [n for n in _HF_FILES if (path / n).is_file()] + sorted(p.name for p in path.glob("*.safetensors"))
        if not any(n.endswith(".safetensors") for n in names):
            raise ValueError(f"--model {spec}: an HF model directory needs *.safetensors weights beside config.json")
        return {"model": path.name, "model_sha256": sha256_files(path, names)}
    raise ValueError(
        f"--model {spec}: not a zoo name ({', '.join(zoo.list_models())}), a .gguf file, an HF model directory "
        f"with config.json, or {architectures.CONFIG_PREFIX}<name> ({', '.join(architectures.list_architectures())})"
    )


def dataset_file(dataset: str, split: str = "dev", data_dir: str | os.PathLike | None = None) -> Path:
    """The JSONL file ``load_dataset(dataset, split, data_dir)`` reads."""
    if str(dataset).endswith(".jsonl"):
        return Path(dataset)
    name = str(dataset).lower()
    if name == "sample":
        with importlib.resources.as_file(importlib.resources.files("atp_jax.data") / "wtq_sample.jsonl") as path:
            return Path(path)
    if name not in dataset_choices():
        raise ValueError(f"--dataset {dataset}: use one of {', '.join(dataset_choices())} or a path ending in .jsonl")
    root = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR)
    if not root:
        raise ValueError(
            f"--dataset {dataset}: pass --data_dir or set {DATA_ENV_VAR} to a folder holding {name}/{split}.jsonl"
        )
    return Path(root) / name / f"{split}.jsonl"


def dataset_fingerprint(dataset: str, split: str = "dev", data_dir: str | os.PathLike | None = None) -> dict:
    """``{"dataset", "split", "dataset_sha256"}``; the file's location is not part of it, its content is."""
    path = dataset_file(dataset, split, data_dir)
    if not path.is_file():
        raise ValueError(f"--dataset {dataset} (split {split}): {path} does not exist")
    return {"dataset": str(dataset), "split": split, "dataset_sha256": sha256_file(path)}
