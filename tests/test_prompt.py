"""The answer instruction of the prompt: per dataset by default, the plain wording for all on request.

The plain wording is compared with the exact text the committed records were made with, written out here."""

import subprocess
import sys

import pytest

from atp_jax.tables.layout import build_layout
from atp_jax.tables.prompt import PromptStyle, instruction, reference_answer, render_prompt
from atp_jax.tables.table import Example, Table

# The instructions of the committed records, verbatim.
PLAIN = {
    "concise": "Answer the question using the table. Reply with the answer only, as briefly as possible. "
    "If there are several answers, separate them with '|'.",
    "step_by_step": "Answer the question using the table. Think step by step, then end with a last line of the "
    "form 'Final answer: <answer>'. If there are several answers, separate them with '|'.",
}
TABLE = Table(["Item", "2019 ($ in millions)"], [["Revenue", "1.5"], ["Margin (%)", "12.5"]])


@pytest.mark.parametrize("reasoning", list(PLAIN))
@pytest.mark.parametrize("dataset", ["wtq", "tatqa", "fetaqa", ""])
def test_plain_is_the_committed_wording_for_every_dataset(reasoning, dataset):
    assert instruction(PromptStyle(reasoning=reasoning, answer_format="plain"), dataset) == PLAIN[reasoning]


@pytest.mark.parametrize("reasoning", list(PLAIN))
@pytest.mark.parametrize("dataset", ["wtq", "fetaqa", "", "WTQ"])
def test_wtq_and_fetaqa_keep_the_committed_wording_by_default(reasoning, dataset):
    assert instruction(PromptStyle(reasoning=reasoning), dataset) == PLAIN[reasoning]


@pytest.mark.parametrize("reasoning", list(PLAIN))
def test_tatqa_asks_for_the_scale_by_default(reasoning):
    text = instruction(PromptStyle(reasoning=reasoning), "tatqa")
    assert text != PLAIN[reasoning]
    for asked in ("thousand", "million", "billion", "percent sign", "separate them with '|'"):
        assert asked in text, asked
    assert ("Final answer: <answer>" in text) == (reasoning == "step_by_step")


def test_render_prompt_follows_the_examples_dataset(smollm2_tokenizer):
    tatqa = Example(
        "What was the revenue in 2019?",
        TABLE,
        ["1.5"],
        "t",
        dataset="tatqa",
        meta={"scale": "million", "answer_type": "span"},
    )
    wtq = Example("What was the revenue in 2019?", TABLE, ["1.5"], "w", dataset="wtq")
    tatqa_text = render_prompt(smollm2_tokenizer, tatqa).text
    assert instruction(PromptStyle(), "tatqa") in tatqa_text and PLAIN["concise"] not in tatqa_text
    assert PLAIN["concise"] in render_prompt(smollm2_tokenizer, tatqa, style=PromptStyle(answer_format="plain")).text
    assert PLAIN["concise"] in render_prompt(smollm2_tokenizer, wtq).text


def test_unknown_answer_format_is_refused():
    with pytest.raises(ValueError, match="answer_format must be one of dataset, plain, got 'fancy'"):
        PromptStyle(answer_format="fancy")


PARAGRAPHS = ("Revenue rose on higher volumes.", "Margins fell as costs grew.")


def test_paragraphs_are_shown_only_when_asked(smollm2_tokenizer):
    bare = Example("What was the revenue in 2019?", TABLE, ["1.5"], "t", dataset="tatqa")
    with_text = Example("What was the revenue in 2019?", TABLE, ["1.5"], "t", dataset="tatqa", paragraphs=PARAGRAPHS)
    # Off (the default): the prompt is the one without paragraphs, word for word.
    assert render_prompt(smollm2_tokenizer, with_text).text == render_prompt(smollm2_tokenizer, bare).text
    prompt = render_prompt(smollm2_tokenizer, with_text, style=PromptStyle(paragraphs=True))
    assert "Text:\n" + "\n".join(PARAGRAPHS) + "\n\nQuestion: What was the revenue" in prompt.after
    assert prompt.table.text not in prompt.after  # the paragraphs follow the table and never move with it
    # An example without paragraphs reads the same under either setting.
    assert render_prompt(smollm2_tokenizer, bare, style=PromptStyle(paragraphs=True)).text == (
        render_prompt(smollm2_tokenizer, bare).text
    )


def test_paragraphs_enter_the_recorded_style_only_when_on():
    assert PromptStyle().as_dict() == {
        "linearization": "markdown",
        "reasoning": "concise",
        "system": None,
        "answer_format": "dataset",
    }
    assert PromptStyle(paragraphs=True).as_dict()["paragraphs"] is True


def test_layout_with_paragraphs_equals_the_retokenized_permuted_text(smollm2_tokenizer):
    example = Example("What was the revenue in 2019?", TABLE, ["1.5"], "t", dataset="tatqa", paragraphs=PARAGRAPHS)
    style = PromptStyle(paragraphs=True)
    layout = build_layout(smollm2_tokenizer, example, style=style)
    assert layout.is_compositional
    permuted = TABLE.permute([1, 0], [1, 0])
    text = render_prompt(smollm2_tokenizer, example, permuted, style).text
    expected = smollm2_tokenizer.encode(text, add_special_tokens=False) + smollm2_tokenizer.encode(
        reference_answer(example), add_special_tokens=False
    )
    assert layout.ids([1, 0], [1, 0]).tolist() == expected


def test_any_import_of_the_package_gives_the_prompt_every_dataset_wording():
    """The dataset registry hands its wording down to the prompt; importing any module of the package (here the
    prompt alone, in a new interpreter) must register it before a prompt is rendered."""
    code = "from atp_jax.tables.prompt import PromptStyle, instruction\nprint(instruction(PromptStyle(), 'tatqa'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "scale word" in out
