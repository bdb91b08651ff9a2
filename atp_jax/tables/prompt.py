"""Chat prompts for table QA: the text before the table, the table, the text after it, the answer.

The instruction says how to reason and how to write the answer; the second part can follow the example's dataset
(``PromptStyle.answer_format``), since each dataset's metric wants the answer in its own form.

A prompt is rendered through the tokenizer's chat template with a sentinel in place of the table,
then cut at the sentinel. That keeps the template's own system prompt, role markers and generation
header exact, and tells the token layout which text never moves (``before``) and where the table
sits.
"""

from __future__ import annotations

import dataclasses
import re

from atp_jax.tables.linearize import Linearized, linearize
from atp_jax.tables.table import Example, Table

ANSWER_SEPARATOR = " | "
FINAL_ANSWER_MARKER = "Final answer:"

ANSWER_FORMATS = ("dataset", "plain")

_REASONING_INSTRUCTIONS = {
    "concise": "Answer the question using the table. Reply with the answer only, as briefly as possible.",
    "step_by_step": "Answer the question using the table. Think step by step, then end with a last line of the "
    f"form '{FINAL_ANSWER_MARKER} <answer>'.",
}
_SEVERAL_ANSWERS = f"If there are several answers, separate them with '{ANSWER_SEPARATOR.strip()}'."
_SENTINEL = "\u2063TABLE\u2063"  # invisible separator: never occurs in a template or a question
# A dataset's own answer wording, by dataset name. The dataset registry (a layer beside this one that reads
# tables) hands each registered dataset's wording down through ``register_answer_instruction``, so the prompt
# never imports the registry.
_ANSWER_INSTRUCTIONS: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class PromptStyle:
    """How a question is put to the model.

    linearization: table format (``markdown``, ``csv``, ``html``, ``json``; see ``linearize``).
    reasoning: ``concise`` (answer only) or ``step_by_step`` (reasoning, then a final-answer line).
    system: system prompt; None keeps the chat template's default one.
    answer_format: ``dataset`` asks for the answer in the form the example's dataset is scored in (TAT-QA: a
        number with its scale word or percent sign); ``plain`` gives every dataset the generic wording (only how
        to separate several answers), which is also what ``dataset`` gives WTQ and FeTaQA.
    paragraphs: show the example's paragraphs (``Example.paragraphs``: TAT-QA's text beside the table) after
        the table, under ``Text:``; they never move, so an attack still permutes only the table.
    """

    linearization: str = "markdown"
    reasoning: str = "concise"
    system: str | None = None
    answer_format: str = "dataset"
    paragraphs: bool = False

    def __post_init__(self):
        if self.reasoning not in _REASONING_INSTRUCTIONS:
            raise ValueError(f"reasoning must be 'concise' or 'step_by_step', got {self.reasoning!r}")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {self.answer_format!r}")

    def as_dict(self) -> dict:
        """The style as a run manifest records it (part of the run's identity): every field, but ``paragraphs``
        only when on, so that folders recorded before the field existed keep their identity."""
        fields = dataclasses.asdict(self)
        if not self.paragraphs:
            del fields["paragraphs"]
        return fields


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A rendered prompt: ``before + table.text + after`` is the full text up to the answer."""

    before: str
    table: Linearized
    after: str

    @property
    def text(self) -> str:
        return self.before + self.table.text + self.after


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of a piece of prompt text, without the tokenizer's own BOS/EOS (the chat template owns those)."""
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def register_answer_instruction(dataset: str, wording: str) -> None:
    """Asks ``dataset``'s answers in ``wording`` under ``PromptStyle(answer_format="dataset")``.

    ``atp_jax.data.registry.register_dataset`` calls it for every dataset whose spec has an
    ``answer_instruction``; registering other wording for a name already registered is refused.
    """
    name = dataset.lower()
    if _ANSWER_INSTRUCTIONS.get(name, wording) != wording:
        raise ValueError(f"dataset {dataset!r} already has an answer instruction: {_ANSWER_INSTRUCTIONS[name]!r}")
    _ANSWER_INSTRUCTIONS[name] = wording


def instruction(style: PromptStyle, dataset: str = "") -> str:
    """The instruction before the table: how to reason, then how to write the answer for ``dataset``."""
    answer_format = _SEVERAL_ANSWERS
    own = _ANSWER_INSTRUCTIONS.get(dataset.lower()) if style.answer_format == "dataset" else None
    if own:
        answer_format = f"{own} {_SEVERAL_ANSWERS}"
    return f"{_REASONING_INSTRUCTIONS[style.reasoning]} {answer_format}"


def user_message(
    question: str, style: PromptStyle, table_text: str, dataset: str = "", paragraphs: tuple[str, ...] = ()
) -> str:
    """The user turn: the instruction for ``dataset`` (``example.dataset``), the table, with ``style.paragraphs``
    the paragraphs (one per line), the question."""
    text = "\n\nText:\n" + "\n".join(paragraphs) if style.paragraphs and paragraphs else ""
    return f"{instruction(style, dataset)}\n\nTable:\n{table_text}{text}\n\nQuestion: {question}"


def chat_messages(example: Example, table_text: str, style: PromptStyle = PromptStyle()) -> list[dict[str, str]]:
    """The chat messages of ``example`` with ``table_text`` in place of its table: ``style.system`` (when set), then the
    user turn. ``render_prompt`` puts them through a tokenizer's chat template; a chat server applies its own."""
    messages = [
        {
            "role": "user",
            "content": user_message(example.question, style, table_text, example.dataset, example.paragraphs),
        }
    ]
    if style.system is not None:
        messages.insert(0, {"role": "system", "content": style.system})
    return messages


def render_prompt(
    tokenizer, example: Example, table: Table | None = None, style: PromptStyle = PromptStyle()
) -> Prompt:
    """The chat prompt for ``example`` (over ``table`` when given, e.g. a permuted one)."""
    table = example.table if table is None else table
    messages = chat_messages(example, _SENTINEL, style)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    before, sentinel, after = text.partition(_SENTINEL)
    if not sentinel:
        raise ValueError("the tokenizer's chat template dropped the user message; cannot place the table")
    return Prompt(before, linearize(table, style.linearization), after)


def reference_answer(example: Example) -> str:
    """The gold answer as the model is asked to write it (several answers joined by the separator)."""
    if not example.answers or not any(a.strip() for a in example.answers):
        raise ValueError(f"example {example.id!r} has no reference answer; the CE objective needs one")
    return ANSWER_SEPARATOR.join(example.answers)


def extract_answer(reply: str, style: PromptStyle = PromptStyle()) -> str:
    """The answer part of a model reply: the text after the last final-answer marker when reasoning."""
    reply = reply.strip()
    if style.reasoning == "step_by_step":
        matches = list(re.finditer(re.escape(FINAL_ANSWER_MARKER), reply, flags=re.IGNORECASE))
        if matches:
            reply = reply[matches[-1].end() :]
        else:  # no marker: fall back to the last non-empty line
            lines = [line for line in reply.splitlines() if line.strip()]
            reply = lines[-1] if lines else ""
    return reply.strip().strip("*").strip()
