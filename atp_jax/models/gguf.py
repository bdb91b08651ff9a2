"""Read a GGUF checkpoint into Hugging Face terms, without torch.

A GGUF file (llama.cpp's format) carries everything a causal LM needs: hyper-parameters and the
tokenizer as metadata, and the weights as (often quantized) tensors under llama.cpp's names. This
module turns those into what the rest of atp_jax expects, i.e. the Hugging Face conventions:

* :func:`read_gguf_config` -- an HF-style ``config.json`` dict (``hidden_size``, ``rope_theta``...).
* :func:`iter_gguf_tensors` -- ``(hf_name, float32 array)`` pairs in HF ``(out, in)`` layout, one
  tensor at a time, so a caller can copy each into a preallocated buffer and keep peak memory low.
* :func:`load_gguf_tokenizer` -- a ``transformers.PreTrainedTokenizerFast`` built with the
  ``tokenizers`` library from the vocabulary and merges stored in the file, with the chat template.

Only the ``llama`` and ``qwen2`` architectures are supported; both are dense decoder-only models
with the same tensor set (qwen2 adds q/k/v biases). Any file problem is reported at this edge as a
``ValueError`` naming the file, never as a numpy/memmap error from deep inside the reader.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

if TYPE_CHECKING:
    from tokenizers import normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_PRE_TOKENIZERS",
    "read_gguf_config",
    "iter_gguf_tensors",
    "load_gguf_tokenizer",
]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

# Qwen2's pre-tokenization split, as published in Qwen's tokenizer.json. Unlike GPT-2's it keeps
# every digit on its own (\p{N} without '+') and never glues a leading space to a letter run.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SUPPORTED_PRE_TOKENIZERS = ("qwen2", "smollm")

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
            raise _corrupt(
                path, f"tensor {tensor.name!r} ends at byte {end:,} but the file is only {size:,} bytes"
            )
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
        raise ValueError(
            f"unsupported architecture {arch} in {path}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
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

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _hf_name(gguf_name: str, config: dict[str, Any], path: Path) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        raise ValueError(
            f"unexpected tensor {gguf_name!r} in {path}: not part of a {config['model_type']} model "
            "as atp_jax reads it"
        )
    layer, part, kind = int(match.group(1)), match.group(2), match.group(3)
    if layer >= config["num_hidden_layers"]:
        raise ValueError(
            f"tensor {gguf_name!r} in {path} belongs to layer {layer}, "
            f"but the config has {config['num_hidden_layers']} layers"
        )
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def _expected_shape(hf_name: str, config: dict[str, Any]) -> tuple[int, ...]:
    """The HF (out, in) shape ``config`` implies for ``hf_name``."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (vocab, hidden)
    if hf_name == "model.norm.weight":
        return (hidden,)
    stem, kind = hf_name.rsplit(".", 1)
    module = stem.split(".", 3)[3]  # drop "model.layers.{i}."
    out_in = {
        "self_attn.q_proj": (q_dim, hidden),
        "self_attn.k_proj": (kv_dim, hidden),
        "self_attn.v_proj": (kv_dim, hidden),
        "self_attn.o_proj": (hidden, q_dim),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
        "input_layernorm": (hidden,),
        "post_attention_layernorm": (hidden,),
    }[module]
    return out_in[:1] if kind == "bias" else out_in


def _unpermute_rotary(w: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation for llama-architecture checkpoints.

    llama.cpp's converter reorders each head's rows from HF's rotate_half layout (first half, second
    half) to interleaved pairs. Inverting it restores rows usable with HF-style RoPE; without this a
    llama model produces garbage (SmolLM2 emits only newlines).

    Args:
        w: ``(n_heads * head_dim, in)`` weight or ``(n_heads * head_dim,)`` bias.
    Returns:
        Array of the same shape with rows reordered per head.
    """
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


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


def iter_gguf_tensors(
    path: str | os.PathLike[str], config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """Iterate ``(hf_name, array)`` over every tensor in the GGUF at ``path``, one at a time.

    Each tensor is dequantized only when reached, so a caller that copies it into a preallocated
    buffer and drops it holds one float32 tensor at a time (Qwen2.5-0.5B: about 5 GB peak instead of
    8.5 GB for a dict of everything).

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
    missing = [key for key in _CONFIG_KEYS_FOR_TENSORS if key not in config]
    if missing:
        raise ValueError(
            f"config is missing {missing}; pass the dict returned by read_gguf_config({str(path)!r})"
        )
    path, reader = _open(path)
    arch = _meta(reader, "general.architecture", path)
    if arch != config["model_type"]:
        raise ValueError(
            f"config is for model_type {config['model_type']!r} but {path} is {arch!r}; "
            "pass read_gguf_config() of this same file"
        )
    # A generator of its own, so the checks above fail at the call rather than at the first next().
    return _iter_tensors(reader, path, config)


def _iter_tensors(
    reader: gguf.GGUFReader, path: Path, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    arch = config["model_type"]
    # llama.cpp permutes q/k only for the llama architecture; qwen2 tensors are stored as in HF.
    permuted = arch == "llama"
    for tensor in reader.tensors:
        hf_name = _hf_name(tensor.name, config, path)
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as err:
            raise ValueError(f"tensor {tensor.name!r} in {path}: {err}") from None
        except _READER_ERRORS as err:
            raise _corrupt(path, f"tensor {tensor.name!r}: {type(err).__name__}: {err}") from None
        expected = _expected_shape(hf_name, config)
        if array.shape != expected:
            raise ValueError(
                f"tensor {tensor.name!r} ({hf_name}) in {path} dequantizes to shape {array.shape}, "
                f"but the config implies {expected}; the file and config disagree"
            )
        if permuted and (".self_attn.q_proj." in hf_name or ".self_attn.k_proj." in hf_name):
            n_heads = config["num_attention_heads" if ".q_proj." in hf_name else "num_key_value_heads"]
            array = _unpermute_rotary(array, n_heads, config["head_dim"])
        # F32/F16 tensors come back as views of the read-only memmap; hand out an owned copy so
        # callers may modify it and the file mapping is not pinned by a stray reference.
        if np.may_share_memory(array, tensor.data) or array.dtype != np.float32:
            array = np.array(array, dtype=np.float32, copy=True)
        yield hf_name, array


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def _pre_tokenization(
    pre: str, path: Path
) -> tuple[normalizers.Normalizer | None, pre_tokenizers.PreTokenizer]:
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
    raise ValueError(
        f"unsupported tokenizer.ggml.pre {pre!r} in {path}; supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
    )


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer stored in the GGUF at ``path``, without torch.

    Built with the ``tokenizers`` library from ``tokenizer.ggml.tokens`` / ``merges`` /
    ``token_type``: control tokens (type 3, e.g. ``<|im_end|>``) become special tokens and
    user-defined ones (type 4, e.g. ``<tool_call>``) plain added tokens, so both are matched whole.
    The pre-tokenizer follows ``tokenizer.ggml.pre``. ``chat_template`` comes from
    ``tokenizer.chat_template``, so ``apply_chat_template`` works (it needs jinja2). BOS/EOS are
    added to encodings only when ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` say so (both
    supported models say no; their chat templates write the markers themselves).

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
    normalizer, pre_tokenizer = _pre_tokenization(_meta(reader, "tokenizer.ggml.pre", path), path)
    tokens: list[str] = _meta(reader, "tokenizer.ggml.tokens", path)
    merges = []
    for merge in _meta(reader, "tokenizer.ggml.merges", path):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise ValueError(
                f"malformed merge {merge!r} in {path}: expected two tokens separated by one space"
            )
        merges.append((pair[0], pair[1]))
    # Files without token types mark nothing special; 1 is llama.cpp's NORMAL.
    token_types = _meta(reader, "tokenizer.ggml.token_type", path, None) or [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise _corrupt(path, f"{len(tokens)} tokens but {len(token_types)} token types")

    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()

    # normalized=False: these markers must match the raw text, before NFC or byte-level mapping.
    control = [t for t, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_CONTROL]
    user_defined = [
        t for t, kind in zip(tokens, token_types, strict=True) if kind == _TOKEN_TYPE_USER_DEFINED
    ]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])

    def token(key: str) -> str | None:
        index = _meta(reader, f"tokenizer.ggml.{key}", path, None)
        if index is None:
            return None
        if not 0 <= index < len(tokens):
            raise ValueError(
                f"tokenizer.ggml.{key} = {index} in {path} is outside the {len(tokens)}-token vocabulary"
            )
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
