"""The answer instruction of the prompt: per dataset by default, the plain wording for all on request.

The plain wording is compared with the exact text the committed records were made with, written out here."""

import pytest

from atp_jax.tables.prompt import PromptStyle, instruction, render_prompt
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
