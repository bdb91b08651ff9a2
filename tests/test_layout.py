"""Token layout under permutations against tokenizing the permuted text; prompts; answer_loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atp_jax.data.datasets import load_dataset
from atp_jax.models import gguf, zoo
from atp_jax.tables.layout import build_layout, place
from atp_jax.tables.prompt import PromptStyle, extract_answer, reference_answer, render_prompt
from atp_jax.tables.table import Example, Table

ZOO = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module", params=ZOO)
def tokenizer(request):
    return gguf.load_gguf_tokenizer(zoo.resolve(request.param))


def _retokenized(tokenizer, example, table, style=PromptStyle()):
    """The independent reference: render the permuted table as text and tokenize it whole."""
    text = render_prompt(tokenizer, example, table, style).text
    return tokenizer.encode(text, add_special_tokens=False) + tokenizer.encode(
        reference_answer(example), add_special_tokens=False
    )


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-()%$'/:&", max_size=14)


@st.composite
def tables_and_perms(draw):
    n = draw(st.integers(1, 6))
    m = draw(st.integers(1, 4))
    # Cells as datasets store them: stripped of surrounding whitespace.
    cell = WORD.map(str.strip)
    header = draw(st.lists(cell, min_size=m, max_size=m))
    rows = draw(st.lists(st.lists(cell, min_size=m, max_size=m), min_size=n, max_size=n))
    row_perm = draw(st.permutations(range(n)))
    col_perm = draw(st.permutations(range(m)))
    return Table(header, rows), row_perm, col_perm


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=tables_and_perms())
def test_layout_equals_retokenized_permuted_text_markdown(tokenizer, case):
    table, row_perm, col_perm = case
    example = Example("Which row comes first?", table, ["Alpha 1"], "h")
    layout = build_layout(tokenizer, example)
    if layout.is_compositional:  # per-cell tokens reproduce the whole text for the original order...
        # ...and then for every order, since only slot contents move.
        assert layout.ids(row_perm, col_perm).tolist() == _retokenized(
            tokenizer, example, table.permute(row_perm, col_perm)
        )


def test_markdown_layout_is_compositional_on_the_sample(tokenizer):
    """On real WTQ tables every markdown layout reproduces the whole-text tokens in random orders."""
    rng = np.random.default_rng(0)
    for example in load_dataset("sample")[:30]:
        layout = build_layout(tokenizer, example)
        assert layout.is_compositional, example.id
        rp, cp = rng.permutation(example.table.n_rows), rng.permutation(example.table.n_cols)
        assert layout.ids(rp, cp).tolist() == _retokenized(tokenizer, example, example.table.permute(rp, cp))


def test_layout_shapes_are_permutation_invariant_and_place_jits_and_vmaps(tokenizer):
    example = load_dataset("sample")[0]
    layout = build_layout(tokenizer, example)
    n, m = example.table.n_rows, example.table.n_cols
    rng = np.random.default_rng(1)
    perms = [(rng.permutation(n), rng.permutation(m)) for _ in range(4)]
    assert len({len(layout.ids(r, c)) for r, c in perms}) == 1
    rows = jnp.asarray(np.stack([r for r, _ in perms]))
    cols = jnp.asarray(np.stack([c for _, c in perms]))
    arrays = layout.arrays()
    batched = jax.jit(jax.vmap(lambda r, c: place(arrays, r, c, **layout.static_sizes())))(rows, cols)
    for k, (r, c) in enumerate(perms):
        np.testing.assert_array_equal(batched[k], place(layout.arrays(np), r, c, **layout.static_sizes()))
    # Answer tokens sit at the end of the body and are predicted from the position before each.
    ids = layout.ids()
    A = layout.answer_length
    np.testing.assert_array_equal(ids[-A:], layout.answer_ids)
    assert layout.answer_logit_positions()[0] + layout.prefix_length == len(ids) - A - 1


def test_prompt_keeps_template_and_places_table(tokenizer):
    example = load_dataset("sample")[0]
    prompt = render_prompt(tokenizer, example)
    assert prompt.before.startswith("<|im_start|>system")
    assert prompt.after.endswith("<|im_start|>assistant\n")
    assert example.question in prompt.after
    assert prompt.table.text in prompt.text


def test_csv_and_html_mismatches_are_detected_not_hidden(tokenizer):
    """Styles whose separators merge with cell text under BPE are flagged as non-compositional."""
    example = Example("q?", Table(["Team", "City"], [["Lions", "Paris"], ["Bears", "Rome"]]), ["Lions"], "x")
    for style in ("csv", "html"):
        layout = build_layout(tokenizer, example, style=PromptStyle(linearization=style))
        whole = _retokenized(tokenizer, example, example.table, PromptStyle(linearization=style))
        assert layout.is_compositional == (layout.ids().tolist() == whole)


def test_extract_answer_step_by_step():
    style = PromptStyle(reasoning="step_by_step")
    assert extract_answer("Alice has 12.\nBob has 7.\nFinal answer: Alice", style) == "Alice"
    assert extract_answer("reasoning\n**Final Answer:** 1990 | 1991", style) == "1990 | 1991"
    assert extract_answer("no marker\nAlice\n", style) == "Alice"
    assert extract_answer("  Alice  ") == "Alice"


def test_bad_inputs_raise_clear_errors(tokenizer):
    table = Table(["a"], [["1"]])
    with pytest.raises(ValueError, match="no reference answer"):
        build_layout(tokenizer, Example("q", table, [], "empty"))
    with pytest.raises(ValueError, match="reasoning must be"):
        PromptStyle(reasoning="verbose")
    with pytest.raises(ValueError, match="style"):
        build_layout(tokenizer, Example("q", table, ["1"], "x"), style=PromptStyle(linearization="latex"))
