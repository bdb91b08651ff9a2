"""``load_model(spec)``: a zoo name, an HF model directory, a ``.gguf`` file, a Hugging Face Hub id or
``config:<architecture>`` (random weights, for benchmarks) -> a ready model, on one device or a mesh."""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from jax.sharding import Mesh

from atp_jax.models import architectures, gguf, hub, params, zoo
from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import Transformer
from atp_jax.sharding import make_mesh

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
# Turn terminators besides the config's EOS: chat models end an answer with these.
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A decoder with its config and tokenizer. ``name`` identifies it in result records."""

    name: str
    config: ModelConfig
    model: Transformer
    tokenizer: Any  # transformers.PreTrainedTokenizerFast; None only for a config: model without one
    source: str
    load_seconds: float

    @property
    def dtype(self):
        return self.model.dtype

    @property
    def mesh(self) -> Mesh | None:
        """The device mesh the weights live on (``atp_jax.sharding``); None: one device."""
        return self.model.mesh

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a generated answer: the config's EOS plus the tokenizer's turn terminators."""
        ids = set(self.config.eos_token_ids)
        if self.tokenizer is None:
            return tuple(sorted(ids))
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        vocab = self.tokenizer.get_vocab()
        ids.update(vocab[t] for t in _STOP_TOKENS if t in vocab)
        return tuple(sorted(ids))


def load_model(
    spec: str | Path = DEFAULT_MODEL,
    dtype=jnp.float32,
    tokenizer: str | Path | None = None,
    mesh: Mesh | str | None = None,
    remat: bool = False,
) -> LoadedModel:
    """Loads a model by zoo name (see ``atp_jax.models.zoo.list_models()``), HF directory, GGUF path or Hugging
    Face Hub id (``org/name``: safetensors, config and tokenizer downloaded once, see ``atp_jax.models.hub``).

    ``config:<name>`` (see ``atp_jax.models.architectures.list_architectures()``) builds that
    architecture with random weights (seed 0), for speed and memory measurements.

    ``dtype`` is the parameter dtype (``jnp.float32`` or ``jnp.bfloat16``); norms, softmax and logits
    are float32 either way. ``tokenizer``, an HF tokenizer directory, replaces the model's own (for a
    ``config:`` model: its family's zoo tokenizer, which an offline machine may not have).

    ``mesh``: a ``jax.sharding.Mesh`` with axes ``data`` and ``model`` or its ``--mesh`` string
    (``"data=2,model=4"``, see ``atp_jax.sharding.make_mesh``); the weights are split over ``model``
    (tensor-parallel) and copied along ``data``, each device receiving only its shards. None: one device.

    ``remat``: gradients recompute each layer's activations instead of keeping them (``Transformer.remat``) —
    for long prompts, many restarts or large models whose backward would not fit otherwise.
    """
    loaded = _load(spec, dtype, tokenizer, mesh)
    loaded.model.remat = remat
    return loaded


def _load(spec, dtype, tokenizer, mesh) -> LoadedModel:
    start = time.perf_counter()
    if isinstance(mesh, str):
        mesh = make_mesh(mesh)
    spec_str = str(spec)
    replacement = _hf_tokenizer(Path(tokenizer).expanduser()) if tokenizer is not None else None
    if spec_str.startswith(architectures.CONFIG_PREFIX):
        return _random_weights_model(spec_str, dtype, start, replacement, tokenizer, mesh)
    path, from_hub = _model_path(spec_str)

    if path.is_file() and path.suffix == ".gguf":
        hf_config = gguf.read_gguf_config(path)
        config = ModelConfig.from_hf(hf_config, source=str(path))
        tokenizer = replacement or gguf.load_gguf_tokenizer(path)
        blocks = gguf.iter_gguf_row_blocks(path, hf_config)
        gguf.clear_cache()  # the parsed metadata is done with: free it before the weights arrive
        model = params.build_model_from_blocks(config, blocks, dtype, source=str(path), mesh=mesh)
    elif path.is_dir():
        config_file = path / "config.json"
        if not config_file.exists():
            raise ValueError(f"{path}: an HF model directory needs config.json")
        config = ModelConfig.from_hf(json.loads(config_file.read_text()), source=str(config_file))
        model = params.build_model(config, params.iter_safetensors(path), dtype, source=str(path), mesh=mesh)
        tokenizer = replacement or _hf_tokenizer(path)
    else:
        raise ValueError(f"{path}: expected a .gguf file or an HF model directory")
    if spec_str in zoo.list_models():  # the name pins the file (sha256); the cache path is this machine's
        name, source = spec_str, f"zoo:{spec_str}"
    elif from_hub:
        name, source = spec_str, f"hub:{spec_str}@{hub.revision_of(path)}"
    else:
        name, source = path.name, str(path)
    return LoadedModel(name, config, model, tokenizer, source, time.perf_counter() - start)


def _random_weights_model(spec: str, dtype, start: float, replacement, tokenizer_dir, mesh) -> LoadedModel:
    """A named architecture with seeded random weights and its family's zoo tokenizer.

    Only token ids matter for speed, so a smaller tokenizer of the same family stands in for the real
    one (its ids all lie inside the architecture's vocabulary). Where the zoo cannot provide it
    (offline, not cached) the model comes without a tokenizer: forward/backward timings on token ids
    still work, text prompts do not. A ``replacement`` tokenizer (loaded from ``tokenizer_dir``) skips the zoo.
    """
    name = spec[len(architectures.CONFIG_PREFIX) :]
    config = architectures.model_config(name)
    if replacement is not None:  # checked before the (slow) random initialisation
        tokenizer, tokenizer_model = replacement, str(tokenizer_dir)
        if len(tokenizer) > config.vocab_size:
            raise ValueError(
                f"{tokenizer_dir}: its {len(tokenizer)} tokens do not fit {spec}'s vocabulary of "
                f"{config.vocab_size}; use a tokenizer of the same family"
            )
    else:
        tokenizer, tokenizer_model = None, architectures.FAMILY_TOKENIZER[config.architecture]
        try:
            tokenizer = gguf.load_gguf_tokenizer(zoo.resolve(tokenizer_model))
        except zoo.ZooError as e:
            warnings.warn(
                f"{spec}: no tokenizer (zoo model {tokenizer_model!r} unavailable: {e}); "
                "pass tokenizer=<HF tokenizer directory>",
                stacklevel=3,
            )
    model = params.random_model(config, seed=0, dtype=dtype, mesh=mesh)
    source = f"{spec} (random weights, seed 0; tokenizer of {tokenizer_model if tokenizer else 'none'})"
    return LoadedModel(spec, config, model, tokenizer, source, time.perf_counter() - start)


def _model_path(spec: str) -> tuple[Path, bool]:
    """The file or folder ``spec`` names (a zoo name's verified GGUF, a hub id's download) and whether it came from
    the hub; ``ValueError`` listing what a spec can be."""
    path = Path(spec).expanduser()
    if spec in zoo.list_models():
        return zoo.resolve(spec), False
    if hub.is_hub_id(spec):
        return hub.fetch(spec), True
    if not path.exists():
        raise ValueError(
            f"unknown model {spec!r}: not a zoo name ({', '.join(zoo.list_models())}), "
            f"an HF model directory, a .gguf file, a Hugging Face Hub id (org/name) or "
            f"{architectures.CONFIG_PREFIX}<name> ({', '.join(architectures.list_architectures())})"
        )
    return path, False


def load_tokenizer(spec: str | Path, tokenizer: str | Path | None = None):
    """The tokenizer of model ``spec`` (the specs of ``load_model`` but ``config:``) without its weights, or the HF
    tokenizer directory ``tokenizer`` when given: what a victim behind a server needs to render its prompts."""
    if tokenizer is not None:
        return _hf_tokenizer(Path(tokenizer).expanduser())
    path, _ = _model_path(str(spec))
    if path.is_file() and path.suffix == ".gguf":
        return gguf.load_gguf_tokenizer(path)
    if path.is_dir():
        return _hf_tokenizer(path)
    raise ValueError(f"{path}: expected a .gguf file or an HF model directory")


def _hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # transformers raises many types for a missing/broken tokenizer
        raise ValueError(f"{path}: could not load a tokenizer from the directory ({type(e).__name__}: {e})") from e
