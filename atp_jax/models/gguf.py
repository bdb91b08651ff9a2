"""Read a GGUF checkpoint into Hugging Face terms, without torch.

A GGUF file (llama.cpp's format) carries everything a causal LM needs: hyper-parameters and the
tokenizer as metadata, and the weights as (often quantized) tensors under llama.cpp's names. This
module turns those into what the rest of atp_jax expects, i.e. the Hugging Face conventions:

* :func:`read_gguf_config` -- an HF-style ``config.json`` dict (``hidden_size``, ``rope_theta``...).
* :func:`iter_gguf_tensors` -- ``(hf_name, float32 array)`` pairs in HF ``(out, in)`` layout, one
  tensor at a time; :func:`iter_gguf_row_blocks` the same in blocks of rows, so a caller can copy each
  into a preallocated buffer and keep peak memory at the weights plus one block.
* :func:`load_gguf_tokenizer` -- a ``transformers.PreTrainedTokenizerFast`` built with the
  ``tokenizers`` library from the vocabulary and merges stored in the file, with the chat template.
* :func:`write_dequantized` -- a copy of a GGUF with every tensor in float32: a llama.cpp server then computes
  with the very weights this package loads (on quantized tensors llama.cpp also quantizes the activations).

The architectures and their tensor names are those of ``atp_jax.models.schema`` (``llama`` and
``qwen2``: dense decoder-only models with the same tensor set; qwen2 adds q/k/v biases). Any file
problem is reported at this edge as a ``ValueError`` naming the file, never as a numpy/memmap error
from deep inside the reader.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

from atp_jax.models.config import ModelConfig
from atp_jax.models.schema import SUPPORTED_ARCHITECTURES, TensorSpec, schema_for

if TYPE_CHECKING:
    from tokenizers import normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_PRE_TOKENIZERS",
    "clear_cache",
    "iter_gguf_row_blocks",
    "iter_gguf_tensors",
    "load_gguf_tokenizer",
    "read_gguf_config",
]

# Qwen2's pre-tokenization split, as published in Qwen's tokenizer.json. Unlike GPT-2's it keeps
# every digit on its own (\p{N} without '+') and never glues a leading space to a letter run.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Llama 3's split (tiktoken's cl100k pattern): digits in runs of up to three, a leading space glued to a word.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's names of Llama 3's pre-tokenizer (llama-bpe is what its converter writes).
_LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")

SUPPORTED_PRE_TOKENIZERS = ("qwen2", "smollm", *_LLAMA3_NAMES)

# llama.cpp token types (tokenizer.ggml.token_type), see llama_token_type in llama.h.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# Exceptions GGUFReader raises when the bytes are not a well-formed GGUF: it parses with numpy
# views and struct-like reads, so truncation shows up as reshape/view/index errors.
_READER_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    struct.error,
    UnicodeDecodeError,
    OverflowError,
    EOFError,
)

_GGUF_MAGIC = b"GGUF"


# --------------------------------------------------------------------------------------------
# Opening a file
# --------------------------------------------------------------------------------------------


def _corrupt(path: Path, detail: str) -> ValueError:
    return ValueError(
        f"corrupt or truncated GGUF: {path} ({detail}); "
        "delete it and fetch it again (atp_jax.models.zoo.resolve re-downloads and verifies zoo models)"
    )


def _open(path: str | os.PathLike[str]) -> tuple[Path, gguf.GGUFReader]:
    """Open ``path`` with GGUFReader after checking it is a complete GGUF file.

    Parsing the metadata of a large vocabulary is slow (about 8 s for Qwen's 152k tokens and merges),
    and loading a model reads config, tensors and tokenizer from the same file, so readers are
    cached per (path, size, mtime): a file replaced on disk is parsed afresh.
    """
    path = Path(path).expanduser()
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"GGUF file not found: {path}") from None
    if not path.is_file():
        raise ValueError(f"expected a GGUF file, got a directory or special file: {path}")
    return path, _open_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def clear_cache() -> None:
    """Drops the parsed readers :func:`_open` keeps. Their metadata (a large vocabulary's tokens and merges
    parse into hundreds of MB of objects) is needed for the config and the tokenizer, not for the weights."""
    _open_cached.cache_clear()


@functools.lru_cache(maxsize=2)
def _open_cached(resolved: str, size: int, mtime_ns: int) -> gguf.GGUFReader:
    # size and mtime_ns are part of the cache key only; they invalidate entries for changed files.
    path = Path(resolved)
    with open(path, "rb") as f:
        magic = f.read(len(_GGUF_MAGIC))
    if magic != _GGUF_MAGIC:
        raise _corrupt(path, f"bad magic {magic!r}, expected {_GGUF_MAGIC!r}")
    try:
        reader = gguf.GGUFReader(path)
    except _READER_ERRORS as err:
        raise _corrupt(path, f"{type(err).__name__}: {err}; file is {size:,} bytes") from None
    # The reader maps tensor data lazily; make sure every tensor it declares really lies in the file
    # so a truncation never surfaces later as a short memmap in the middle of dequantization.
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise _corrupt(path, f"tensor {tensor.name!r} ends at byte {end:,} but the file is only {size:,} bytes")
    return reader


_MISSING = object()


def _meta(reader: gguf.GGUFReader, key: str, path: Path, default: Any = _MISSING) -> Any:
    """The metadata value under ``key`` as a Python object (str, int, float, bool or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(
                f"missing required GGUF metadata key {key!r} in {path}; "
                "the file was not written by a llama.cpp converter that atp_jax understands"
            )
        return default
    return field.contents()


def _as_float(value: float) -> float:
    # GGUF stores these as float32; 1e-5 reads back as 9.999999747378752e-06. Round-trip through
    # float32's shortest repr so configs show the value the model was published with (1e-05).
    return float(str(np.float32(value)))


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _rope_scaling(reader: gguf.GGUFReader, arch: str, path: Path) -> dict[str, Any] | None:
    """HF ``rope_scaling`` from ``{arch}.rope.scaling.*`` metadata, or None when there is none."""
    if "rope_freqs.weight" in {t.name for t in reader.tensors}:
        # llama.cpp writes Llama-3.1-style scaling as a tensor of per-frequency factors, not as
        # metadata; HF's low/high_freq_factor cannot be recovered from it exactly, and silently
        # ignoring it would give wrong positions at every sequence length.
        raise ValueError(
            f"{path} stores llama3-style RoPE scaling as a 'rope_freqs.weight' tensor, which atp_jax "
            "does not support; use a checkpoint without RoPE scaling"
        )
    prefix = f"{arch}.rope.scaling."
    rope_type = _meta(reader, prefix + "type", path, None)
    if rope_type is None or rope_type == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": rope_type}
    factor = _meta(reader, prefix + "factor", path, None)
    if factor is not None:
        scaling["factor"] = _as_float(factor)
    original = _meta(reader, prefix + "original_context_length", path, None)
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    attn_factor = _meta(reader, prefix + "attn_factor", path, None)
    if attn_factor is not None:
        scaling["attention_factor"] = _as_float(attn_factor)
    for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        value = _meta(reader, prefix + gguf_key, path, None)
        if value is not None:
            scaling[hf_key] = _as_float(value)
    return scaling


def _config_from_reader(reader: gguf.GGUFReader, path: Path) -> dict[str, Any]:
    arch = _meta(reader, "general.architecture", path)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch} in {path}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    tensors = {t.name: t for t in reader.tensors}

    hidden = int(_meta(reader, f"{arch}.embedding_length", path))
    heads = int(_meta(reader, f"{arch}.attention.head_count", path))
    # Per the GGUF spec head_count_kv is optional and defaults to head_count (no GQA).
    kv_heads = int(_meta(reader, f"{arch}.attention.head_count_kv", path, heads))
    head_dim = _meta(reader, f"{arch}.attention.key_length", path, None)
    if head_dim is None:
        if hidden % heads:
            raise ValueError(
                f"{path}: embedding_length {hidden} is not divisible by head_count {heads} and "
                f"{arch}.attention.key_length is absent, so head_dim is unknown"
            )
        head_dim = hidden // heads

    vocab = _meta(reader, f"{arch}.vocab_size", path, None)
    if vocab is None:
        # Older files (Qwen's here) omit vocab_size; the embedding matrix is the ground truth.
        # GGUF lists dims innermost-first, so shape is (hidden, vocab).
        if "token_embd.weight" not in tensors:
            raise ValueError(f"{path} has neither {arch}.vocab_size metadata nor a token_embd.weight tensor")
        vocab = int(tensors["token_embd.weight"].shape[-1])

    bos = _meta(reader, "tokenizer.ggml.bos_token_id", path, None)
    eos = _meta(reader, "tokenizer.ggml.eos_token_id", path, None)
    return {
        "model_type": arch,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_meta(reader, f"{arch}.feed_forward_length", path)),
        "num_hidden_layers": int(_meta(reader, f"{arch}.block_count", path)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": int(head_dim),
        # llama.cpp falls back to 10000 when freq_base is absent; do the same.
        "rope_theta": _as_float(_meta(reader, f"{arch}.rope.freq_base", path, 10000.0)),
        "rms_norm_eps": _as_float(_meta(reader, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        "max_position_embeddings": int(_meta(reader, f"{arch}.context_length", path)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": None if eos is None else int(eos),
        "rope_scaling": _rope_scaling(reader, arch, path),
    }


def read_gguf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An HF-style ``config.json`` dict for the GGUF at ``path``.

    Keys: ``model_type`` ("llama" or "qwen2"), ``vocab_size``, ``hidden_size``,
    ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``, ``rope_theta``, ``rms_norm_eps``, ``max_position_embeddings``,
    ``tie_word_embeddings`` (no ``output.weight`` tensor), ``attention_bias`` (q/k/v biases
    present), ``bos_token_id``, ``eos_token_id``, ``rope_scaling`` (dict or None).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is corrupt or truncated, its architecture is unsupported, or a
            required metadata key is missing (the message names the key and the file).
    """
    path, reader = _open(path)
    return _config_from_reader(reader, path)


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


def _unpermute_rotary(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for architectures whose schema says it interleaves them.

    llama.cpp's converter reorders each head's rows from HF's rotate_half layout (first half, second
    half) to interleaved pairs. Inverting it restores rows usable with HF-style RoPE; without this a
    llama model produces garbage (SmolLM2 emits only newlines).

    Args:
        w: ``(n * head_dim, in)`` rows of whole heads of a weight, or ``(n * head_dim,)`` of a bias.
    Returns:
        Array of the same shape with rows reordered per head.
    """
    return w.reshape(-1, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_CONFIG_KEYS_FOR_TENSORS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)

# Elements dequantized at a time. The dequantizer's temporaries are a few times its output, so
# bounding the block bounds them; a whole embedding matrix at once would cost gigabytes.
DEFAULT_BLOCK_ELEMENTS = 1 << 22


def iter_gguf_tensors(path: str | os.PathLike[str], config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Iterate ``(hf_name, array)`` over every tensor in the GGUF at ``path``, one at a time.

    Each tensor is read and dequantized only when reached, in blocks of rows, so a caller that
    copies it into a preallocated buffer and drops it holds one float32 tensor at a time. Loading
    a model uses :func:`iter_gguf_row_blocks`, which never holds a whole tensor.

    Args:
        path: the GGUF file.
        config: its :func:`read_gguf_config` dict; shapes are checked against it.
    Yields:
        ``(name, array)``: HF parameter name (``model.layers.3.self_attn.q_proj.weight``) and a
        writable float32 array in HF layout -- ``(out, in)`` for weights, ``(n,)`` for norms and
        biases, ``(vocab_size, hidden_size)`` for embeddings and ``lm_head``. No ``lm_head.weight``
        is yielded for tied checkpoints (``config["tie_word_embeddings"]``).
    Raises:
        ValueError: corrupt/truncated file or a config that does not belong to this file (both
            raised by this call), or, while iterating, a tensor this module does not know or whose
            shape differs from what ``config`` implies.
    """
    path, tensors, model_config = _open_for_tensors(path, config)
    return _whole_tensors(_iter_blocks(tensors, path, model_config, DEFAULT_BLOCK_ELEMENTS), model_config)


def iter_gguf_row_blocks(
    path: str | os.PathLike[str], config: dict[str, Any], block_elements: int = DEFAULT_BLOCK_ELEMENTS
) -> Iterator[tuple[str, int, np.ndarray]]:
    """Iterate ``(hf_name, start, rows)`` over every tensor in the GGUF at ``path``, in blocks of rows.

    Like :func:`iter_gguf_tensors`, but each tensor comes as consecutive blocks of at most about
    ``block_elements`` elements: ``rows`` is the float32 HF rows ``start .. start + len(rows)``.
    Only the bytes of the block in hand are read (with file reads, not a memory map), so neither the
    file nor a whole dequantized tensor is ever resident; memory stays at one block's worth. The
    iterator holds no parsed reader: after this call, :func:`clear_cache` frees the file's metadata.
    """
    path, tensors, model_config = _open_for_tensors(path, config)
    return _iter_blocks(tensors, path, model_config, block_elements)


@dataclasses.dataclass(frozen=True)
class _StoredTensor:
    """Where one tensor lies in the file and how its bytes are laid out (rows first)."""

    name: str
    tensor_type: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order, innermost first
    data_offset: int
    n_bytes: int
    stored_shape: tuple[int, ...]  # the reader's array shape: (rows, values or bytes per row), or (n,)
    stored_dtype: np.dtype

    @classmethod
    def of(cls, tensor: gguf.ReaderTensor) -> _StoredTensor:
        # ``tensor.data`` is a view of the file's memory map: only its shape and dtype are read, so its
        # pages are never touched (they would count as resident memory).
        return cls(
            tensor.name,
            tensor.tensor_type,
            tuple(int(d) for d in tensor.shape),
            int(tensor.data_offset),
            int(tensor.n_bytes),
            tuple(tensor.data.shape),
            tensor.data.dtype,
        )


def _open_for_tensors(path, config: dict[str, Any]) -> tuple[Path, tuple[_StoredTensor, ...], ModelConfig]:
    missing = [key for key in _CONFIG_KEYS_FOR_TENSORS if key not in config]
    if missing:
        raise ValueError(f"config is missing {missing}; pass the dict returned by read_gguf_config({str(path)!r})")
    path, reader = _open(path)
    arch = _meta(reader, "general.architecture", path)
    if arch != config["model_type"]:
        raise ValueError(
            f"config is for model_type {config['model_type']!r} but {path} is {arch!r}; "
            "pass read_gguf_config() of this same file"
        )
    # The checks above fail at the call; the iterators are generators of their own, which start later.
    return path, tuple(_StoredTensor.of(t) for t in reader.tensors), ModelConfig.from_hf(config, source=str(path))


def _spec_of(tensor: _StoredTensor, config: ModelConfig, path: Path) -> tuple[TensorSpec, int | None]:
    found = schema_for(config.architecture).find_gguf(tensor.name)
    if found is None:
        raise ValueError(
            f"unexpected tensor {tensor.name!r} in {path}: not part of a {config.architecture} model "
            "as atp_jax reads it"
        )
    spec, layer = found
    if layer is not None and layer >= config.num_layers:
        raise ValueError(
            f"tensor {tensor.name!r} in {path} belongs to layer {layer}, but the config has {config.num_layers} layers"
        )
    shape = tensor.shape[::-1]  # GGUF lists dims innermost first
    expected = spec.hf_shape(config)
    if shape != expected:
        raise ValueError(
            f"tensor {tensor.name!r} ({spec.hf_name_of(layer)}) in {path} dequantizes to shape {shape}, "
            f"but the config implies {expected}; the file and config disagree"
        )
    return spec, layer


def _iter_blocks(
    tensors: tuple[_StoredTensor, ...], path: Path, config: ModelConfig, block_elements: int
) -> Iterator[tuple[str, int, np.ndarray]]:
    interleaved = schema_for(config.architecture).gguf_rotary_interleaved
    with open(path, "rb") as file:
        for tensor in tensors:
            spec, layer = _spec_of(tensor, config, path)
            hf_name = spec.hf_name_of(layer)
            unpermute = interleaved and spec.rotary
            matrix = len(tensor.stored_shape) > 1
            rows = tensor.stored_shape[0] if matrix else 1
            row_bytes = tensor.n_bytes // rows
            per_block = max(1, block_elements // math.prod(spec.hf_shape(config)[1:]))
            if unpermute:  # whole heads only: the permutation runs within each head
                per_block = max(config.head_dim, per_block // config.head_dim * config.head_dim)
            for start in range(0, rows, per_block):
                count = min(per_block, rows - start)
                raw = np.empty(count * row_bytes, np.uint8)
                file.seek(tensor.data_offset + start * row_bytes)
                if file.readinto(memoryview(raw)) != raw.size:
                    raise _corrupt(path, f"tensor {tensor.name!r}: short read")
                stored = raw.view(tensor.stored_dtype).reshape(
                    (count, *tensor.stored_shape[1:]) if matrix else tensor.stored_shape
                )
                try:
                    array = gguf.quants.dequantize(stored, tensor.tensor_type)
                except NotImplementedError as err:
                    raise ValueError(f"tensor {tensor.name!r} in {path}: {err}") from None
                except _READER_ERRORS as err:
                    raise _corrupt(path, f"tensor {tensor.name!r}: {type(err).__name__}: {err}") from None
                if unpermute:
                    array = _unpermute_rotary(array, config.head_dim)
                if array.dtype != np.float32:
                    array = array.astype(np.float32)
                yield hf_name, start, array


def _whole_tensors(blocks, config: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Joins the row blocks of each tensor into one writable float32 array."""
    current, whole = None, None
    for hf_name, start, rows in blocks:
        if hf_name != current:
            if whole is not None:
                yield current, whole
            current = hf_name
            spec, _ = schema_for(config.architecture).find_hf(hf_name)
            whole = np.empty(spec.hf_shape(config), np.float32)
        whole[start : start + len(rows)] = rows
    if whole is not None:
        yield current, whole


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def _pre_tokenization(pre: str, path: Path) -> tuple[normalizers.Normalizer | None, pre_tokenizers.PreTokenizer]:
    """(normalizer, pre_tokenizer) reproducing the published tokenizer.json of each family."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    if pre == "qwen2":
        return normalizers.NFC(), pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre == "smollm":
        return None, pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _LLAMA3_NAMES:
        return None, pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise ValueError(
        f"unsupported tokenizer.ggml.pre {pre!r} in {path}; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
    )


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer stored in the GGUF at ``path``, without torch.

    Built with the ``tokenizers`` library from ``tokenizer.ggml.tokens`` / ``merges`` /
    ``token_type``: control tokens (type 3, e.g. ``<|im_end|>``) become special tokens and
    user-defined ones (type 4, e.g. ``<tool_call>``) plain added tokens, so both are matched whole.
    The pre-tokenizer follows ``tokenizer.ggml.pre``: Qwen2's, SmolLM2's, or Llama 3's (``llama-bpe``).
    ``chat_template`` comes from ``tokenizer.chat_template``, so ``apply_chat_template`` works (it needs
    jinja2). BOS/EOS are added to encodings only when ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``
    say so (both zoo models say no, their chat templates write the markers themselves; Llama 3 files say
    yes for BOS).

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with bos/eos/pad/unk tokens set from the metadata.
    Raises:
        ValueError: corrupt file, a non-BPE tokenizer model, or an unknown ``tokenizer.ggml.pre``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    path, reader = _open(path)
    model = _meta(reader, "tokenizer.ggml.model", path)
    if model != "gpt2":
        raise ValueError(
            f"unsupported tokenizer.ggml.model {model!r} in {path}; only byte-level BPE ('gpt2') is supported"
        )
    pre = _meta(reader, "tokenizer.ggml.pre", path)
    normalizer, pre_tokenizer = _pre_tokenization(pre, path)
    tokens: list[str] = _meta(reader, "tokenizer.ggml.tokens", path)
    merges = []
    for merge in _meta(reader, "tokenizer.ggml.merges", path):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise ValueError(f"malformed merge {merge!r} in {path}: expected two tokens separated by one space")
        merges.append((pair[0], pair[1]))
    # Files without token types mark nothing special; 1 is llama.cpp's NORMAL.
    token_types = _meta(reader, "tokenizer.ggml.token_type", path, None) or [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise _corrupt(path, f"{len(tokens)} tokens but {len(token_types)} token types")

    vocab = {token: index for index, token in enumerate(tokens)}
    # Llama 3 (tiktoken) takes a whole pre-token that is in the vocabulary as it is, before any merge, as its
    # tokenizer.json (ignore_merges) and llama.cpp do.
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=pre in _LLAMA3_NAMES)
    )
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()

    # normalized=False: these markers must match the raw text, before NFC or byte-level mapping.
    control = [t for t, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_CONTROL]
    user_defined = [t for t, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])

    def token(key: str) -> str | None:
        index = _meta(reader, f"tokenizer.ggml.{key}", path, None)
        if index is None:
            return None
        if not 0 <= index < len(tokens):
            raise ValueError(f"tokenizer.ggml.{key} = {index} in {path} is outside the {len(tokens)}-token vocabulary")
        return tokens[index]

    bos, eos = token("bos_token_id"), token("eos_token_id")
    add_bos = bool(_meta(reader, "tokenizer.ggml.add_bos_token", path, False))
    add_eos = bool(_meta(reader, "tokenizer.ggml.add_eos_token", path, False))
    for flag, marker, name in ((add_bos, bos, "bos"), (add_eos, eos, "eos")):
        if flag and marker is None:
            raise ValueError(f"{path} sets tokenizer.ggml.add_{name}_token but has no {name}_token_id")
    # trim_offsets=False keeps a token's leading space inside its offsets, as the published
    # tokenizer.json files of both families do.
    post = [processors.ByteLevel(trim_offsets=False)]
    if add_bos or add_eos:

        def wrap(sequence: str, type_id: int) -> list[str]:
            return (
                ([f"{bos}:{type_id}"] if add_bos else [])
                + [f"{sequence}:{type_id}"]
                + ([f"{eos}:{type_id}"] if add_eos else [])
            )

        specials = {marker: vocab[marker] for marker, flag in ((bos, add_bos), (eos, add_eos)) if flag}
        post.append(
            processors.TemplateProcessing(
                single=wrap("$A", 0),
                pair=wrap("$A", 0) + wrap("$B", 1),
                special_tokens=list(specials.items()),
            )
        )
    backend.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        unk_token=token("unknown_token_id"),
        pad_token=token("padding_token_id"),
        chat_template=_meta(reader, "tokenizer.chat_template", path, None),
        clean_up_tokenization_spaces=False,
    )


def write_dequantized(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> Path:
    """Writes ``source`` to ``destination`` with every tensor dequantized to float32, metadata (config,
    tokenizer, chat template) unchanged; returns ``destination``. Four bytes per parameter."""
    path, reader = _open(source)
    writer = gguf.GGUFWriter(destination, reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF header itself; the file type no longer holds.
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith(
            "GGUF."
        ):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(values, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(destination)
