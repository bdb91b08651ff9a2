"""KV-cache greedy decoding against recomputing the whole sequence at every step."""

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.inference.generate import greedy_decode
from atp_jax.models.config import ModelConfig
from atp_jax.models.modeling import default_positions
from atp_jax.models.params import random_model

CONFIG = ModelConfig(
    architecture="qwen2",
    vocab_size=61,
    hidden_size=48,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=12,
    attention_bias=True,
    tie_word_embeddings=True,
)


def _model():
    model = random_model(CONFIG, seed=3)
    # Sharper logits than the 0.02 init gives, so greedy choices are far from ties.
    model.embed_tokens[...] = 40.0 * model.embed_tokens[...]
    return model


def _recompute(model, prompt, steps, stop):
    """Greedy decoding by a full forward pass over the whole sequence at every step (no cache).

    The sequence lives right-padded in a fixed buffer: causal attention makes the padding after the
    last real token irrelevant, and one compiled forward serves every step.
    """
    length = len(prompt) + steps
    forward = jax.jit(lambda m, ids: m(m.embed(ids), jnp.arange(length)[None], jnp.ones((1, length), bool)).logits)
    seq = np.zeros((1, length), np.int32)
    seq[0, : len(prompt)] = prompt
    out = []
    for t in range(len(prompt), length):
        token = int(jnp.argmax(forward(model, seq)[0, t - 1]))
        out.append(token)
        if token in stop or t == length - 1:
            break
        seq[0, t] = token
    return out


def test_cached_generation_equals_recomputation_with_left_padding():
    model = _model()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 61, n).tolist() for n in (5, 9, 2)]
    S0 = 12
    ids = np.zeros((3, S0), np.int32)
    mask = np.zeros((3, S0), bool)
    for b, p in enumerate(prompts):
        ids[b, S0 - len(p) :] = p
        mask[b, S0 - len(p) :] = True
    steps = 10
    references = [_recompute(model, p, steps, stop=()) for p in prompts]
    # A stop id that one reference actually produces mid-way, to exercise stopping and padding.
    stop = references[0][4]
    got = np.asarray(greedy_decode(model, ids, mask, np.asarray([stop], np.int32), -1, steps))
    for b, ref in enumerate(references):
        cut = ref.index(stop) + 1 if stop in ref else len(ref)
        assert got[b, :cut].tolist() == ref[:cut], b
        assert (got[b, cut:] == -1).all()


def test_default_positions_count_real_tokens_only():
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    assert default_positions(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
