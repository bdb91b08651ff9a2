"""``load_model(spec)``: a zoo name, an HF model directory or a ``.gguf`` file -> a ready model."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from atp_jax.models import gguf, params, zoo
from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
# Turn terminators besides the config's EOS: chat models end an answer with these.
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A decoder with its config and tokenizer. ``name`` identifies it in result records."""

    name: str
    config: ModelConfig
    model: Transformer
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    source: str
    load_seconds: float

    @property
    def dtype(self):
        return self.model.dtype

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generated answer: the config's EOS plus the tokenizer's turn terminators."""
        ids = set(self.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in _STOP_TOKENS if t in vocab)
        return tuple(sorted(ids))


def load_model(spec: str | Path = DEFAULT_MODEL, dtype=jnp.float32) -> LoadedModel:
    """Loads a model by zoo name (see ``atp_jax.models.zoo.list_models()``), HF directory or GGUF path.

    ``dtype`` is the parameter dtype (``jnp.float32`` or ``jnp.bfloat16``); norms, softmax and logits
    are float32 either way.
    """
    start = time.perf_counter()
    spec_str = str(spec)
    path = Path(spec_str).expanduser()
    if spec_str in zoo.list_models():
        path = zoo.resolve(spec_str)
    elif not path.exists():
        raise ValueError(
            f"unknown model {spec_str!r}: not a zoo name ({', '.join(zoo.list_models())}), "
            "an HF model directory or a .gguf file"
        )

    if path.is_file() and path.suffix == ".gguf":
        hf_config = gguf.read_gguf_config(path)
        config = ModelConfig.from_hf(hf_config, source=str(path))
        model = params.build_model(config, gguf.iter_gguf_tensors(path, hf_config), dtype, source=str(path))
        tokenizer = gguf.load_gguf_tokenizer(path)
    elif path.is_dir():
        config_file = path / "config.json"
        if not config_file.exists():
            raise ValueError(f"{path}: an HF model directory needs config.json")
        config = ModelConfig.from_hf(json.loads(config_file.read_text()), source=str(config_file))
        model = params.build_model(config, params.iter_safetensors(path), dtype, source=str(path))
        tokenizer = _hf_tokenizer(path)
    else:
        raise ValueError(f"{path}: expected a .gguf file or an HF model directory")
    name = spec_str if spec_str in zoo.list_models() else path.name
    return LoadedModel(name, config, model, tokenizer, str(path), time.perf_counter() - start)


def _hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many types for a missing/broken tokenizer
        raise ValueError(f"{path}: could not load a tokenizer from the directory ({type(e).__name__}: {e})") from e

