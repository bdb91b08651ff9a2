"""LLM-as-judge scoring of answers against a reference answer, with the paper's prompt.

The judge sees the question, the reference answer and the assistant's answer — never the table — and
replies with a score from 0 to 1. The prompt is the paper's (appendix A.1, :data:`PAPER_JUDGE_PROMPT`,
word for word); another one is an explicit choice, ``prompt=JudgePrompt(name, template)``, and
``JudgePrompt.summary()`` (its name and the sha256 of its template) goes into a run's manifest.

A reply is read for its *final* score (:func:`parse_judge_score`): reasoning blocks are dropped, "8/10",
"80%", "0,8", "Score: 0.7" and "**0.7**" read as what they mean, and a score that lies outside [0, 1] is
not clamped but recorded as missing. Every judge failure is ``JudgeScore(score=None, raw=reply,
error=reason)``, never 0, so that it is not counted as a wrong answer. The reasons of a reply that came but
gives no score are :data:`REPLY_FAILURES`; those of a request that got no reply are ``"<reason>:
<detail>"`` strings from :mod:`atp_jax.http_client`.

Two backends share one interface, ``judge(items) -> list[JudgeScore]``:

* :class:`ModelJudge` wraps any ``generate_fn(prompts: list[str]) -> list[str]``, e.g. a local model's
  batched greedy generation.
* :class:`OpenAICompatibleJudge` calls an OpenAI-compatible ``/v1/chat/completions`` endpoint, several
  requests at a time, with the paper's temperature 0 and seed 0; every request has a total deadline and
  retries (:class:`~atp_jax.http_client.RequestPolicy`), and no failure of one request ends the batch.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

from atp_jax.http_client import RequestPolicy, post_json

__all__ = [
    "PAPER_JUDGE_PROMPT",
    "REPLY_FAILURES",
    "Judge",
    "JudgeItem",
    "JudgePrompt",
    "JudgeScore",
    "ModelJudge",
    "OpenAICompatibleJudge",
    "build_judge_prompt",
    "parse_judge_score",
]

_PLACEHOLDERS = ("question", "reference_answer", "assistant_answer")


@dataclass(frozen=True)
class JudgePrompt:
    """A judge prompt: a ``str.format`` template with ``{question}``, ``{reference_answer}`` and
    ``{assistant_answer}`` (literal braces doubled), and the name it is recorded under."""

    name: str
    template: str

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a JudgePrompt needs a name: it identifies the prompt in a run's manifest")
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(self.template) if f is not None]
        except ValueError as error:
            raise ValueError(
                f"judge prompt {self.name!r}: the template is not a str.format template ({error}); "
                "double the braces that are meant literally"
            ) from None
        if sorted(set(fields)) != sorted(_PLACEHOLDERS):
            needed = ", ".join("{" + name + "}" for name in _PLACEHOLDERS)
            raise ValueError(
                f"judge prompt {self.name!r} has the placeholders {sorted(set(fields))}; it needs exactly {needed}"
            )

    @property
    def sha256(self) -> str:
        """The sha256 of the template (UTF-8): which prompt was used, checkable after the fact."""
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()

    def summary(self) -> dict:
        """``{"name", "sha256"}``, for a run's manifest."""
        return {"name": self.name, "sha256": self.sha256}

    def format(self, question: str, reference: str, answer: str) -> str:
        return self.template.format(question=question, reference_answer=reference, assistant_answer=answer)


# The paper's appendix A.1, verbatim: its grammar, "Question: {question}." punctuation and the trailing space
# of the last line included. The paper also fixes seed 0 and temperature 0, and does not show the table.
PAPER_JUDGE_PROMPT = JudgePrompt(
    "paper_a1",
    (
        "You are a text analyzer to analyze to what extent the assistant answer is aligned with the reference answer."
        "\n\n"
        "Question: {question}. Reference answer: {reference_answer}. Assistant answer: {assistant_answer}."
        "\n\n"
        "Please provide a score ranging from 0 to 1, where 1 represents perfect alignment and 0 represents no "
        "alignment at all. The final answer should contain the score only. "
    ),
)

_REFERENCE_SEPARATOR = " | "

REPLY_FAILURES = frozenset({"empty", "unparsable", "out_of_range", "unfinished_reasoning"})
"""The reasons a reply that did come gives no score: nothing after any reasoning (``empty``), no number
(``unparsable``), a score outside [0, 1] (``out_of_range``), reasoning that never closed
(``unfinished_reasoning``)."""


@dataclass(frozen=True)
class JudgeItem:
    """One answer to judge.

    Attributes:
        question: the question asked about the table.
        reference: the reference answer; several gold answers are joined with " | ".
        answer: the assistant's answer.
    """

    question: str
    reference: str | tuple[str, ...]
    answer: str

    def __post_init__(self) -> None:
        if not isinstance(self.reference, str):
            object.__setattr__(self, "reference", tuple(self.reference))


@dataclass(frozen=True)
class JudgeScore:
    """The judge's verdict on one answer.

    Attributes:
        score: in [0, 1], or ``None`` when no score could be obtained.
        raw: the judge's reply text ("" when there was no reply).
        error: ``None`` on success; else why there is no score: one of :data:`REPLY_FAILURES` for a reply
            without a usable score, or ``"<reason>: <detail>"`` when the request got none (e.g.
            ``"deadline_exceeded: ..."``, ``"http_503: ... (gave up after 4 attempts)"``, ``"bad_response:
            ..."``; see :mod:`atp_jax.http_client`).
    """

    score: float | None
    raw: str
    error: str | None = None


class Judge(Protocol):
    """Anything that scores a batch of answers with a known prompt."""

    prompt: JudgePrompt

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]: ...


def build_judge_prompt(
    question: str, reference: str | Sequence[str], answer: str, prompt: JudgePrompt = PAPER_JUDGE_PROMPT
) -> str:
    """Fill ``prompt``; a list of reference answers is joined with " | "."""
    if not isinstance(reference, str):
        reference = _REFERENCE_SEPARATOR.join(reference)
    return prompt.format(question.strip(), reference.strip(), answer.strip())


# ------------------------------------------------------------------------------------------ reading a reply

_REASONING_TAG = r"(?:think|thinking|reasoning)"
_REASONING_BLOCK = re.compile(rf"<({_REASONING_TAG})>.*?</\1>", re.DOTALL | re.IGNORECASE)
_REASONING_OPEN = re.compile(rf"<{_REASONING_TAG}>", re.IGNORECASE)
_REASONING_CLOSE = re.compile(rf"</{_REASONING_TAG}>", re.IGNORECASE)
# "0 to 1", "0-1", "between 0 and 1", "0.0 – 1.0": the scale, not a score.
_SCALE = re.compile(
    r"(?:\b(?:from|between|of|in)\s+)?(?<![\w.])0(?:\.0+)?\s*(?:-|–|—|\bto\b|\band\b)\s*"
    r"1(?:\.0+)?(?![.,]?\d)",
    re.IGNORECASE,
)
_NUMBER = r"\d+(?:[.,]\d+)?|\.\d+"  # a decimal comma reads as a decimal point
_SCORE = re.compile(
    rf"(?<![\w./%-])(?P<sign>[-−])?(?P<value>{_NUMBER})"
    rf"(?:\s*(?P<percent>%)|\s*(?:/|\bout\s+of\b)\s*(?P<denominator>{_NUMBER}))?(?!\w)",
    re.IGNORECASE,
)
# A label right before a number makes it the stated score: "Score: 0.7", "**Rating:** 8/10", "score is .5".
_LABEL_BEFORE = re.compile(
    r"\b(?:score|rating|grade)\b(?:\s*(?:is|of|would be|=))?[\s:=*_`'\"#>()\[\]]*$", re.IGNORECASE
)


def _value(match: re.Match) -> float | None:
    value = float(match["value"].replace(",", "."))
    if match["percent"]:
        value /= 100
    elif match["denominator"] is not None:
        denominator = float(match["denominator"].replace(",", "."))
        if denominator == 0:
            return None
        value /= denominator
    return -value if match["sign"] else value


def _is_stated(text: str, match: re.Match) -> bool:
    """A number is a stated score when a label precedes it or it stands alone on its line."""
    line_start = text.rfind("\n", 0, match.start()) + 1
    line_end = text.find("\n", match.end())
    before, after = text[line_start : match.start()], text[match.end() : len(text) if line_end < 0 else line_end]
    alone = not re.search(r"\w", before) and not re.search(r"\w", after)
    return alone or _LABEL_BEFORE.search(before) is not None


def parse_judge_score(reply: str) -> JudgeScore:
    """The final score in the judge's ``reply``.

    Reasoning blocks (``<think>…</think>``, also when only the closing tag is in the reply) are dropped; an
    unclosed one means the judge never answered (``unfinished_reasoning``). Scale descriptions ("0 to 1")
    are ignored. Of the numbers left — plain, "8/10", "8 out of 10", "80%", "0,8" — the last *stated*
    one (after "score:"/"rating:", or alone on its line, markdown aside) is the score, else the last
    one. A score outside [0, 1] is ``out_of_range``, never clamped.
    """
    text = _REASONING_BLOCK.sub(" ", reply)
    closes = list(_REASONING_CLOSE.finditer(text))
    if closes:  # the opening tag was part of the prompt (a reasoning model's chat template)
        text = text[closes[-1].end() :]
    if _REASONING_OPEN.search(text):
        return JudgeScore(score=None, raw=reply, error="unfinished_reasoning")
    if not text.strip():
        return JudgeScore(score=None, raw=reply, error="empty")
    text = _SCALE.sub(" ", text).strip()
    numbers = list(_SCORE.finditer(text))
    if not numbers:
        return JudgeScore(score=None, raw=reply, error="unparsable")
    stated = [m for m in numbers if _is_stated(text, m)]
    value = _value((stated or numbers)[-1])
    if value is None:
        return JudgeScore(score=None, raw=reply, error="unparsable")
    if not 0.0 <= value <= 1.0:
        return JudgeScore(score=None, raw=reply, error="out_of_range")
    return JudgeScore(score=value, raw=reply)


# ------------------------------------------------------------------------------------------ backends


@dataclass(frozen=True)
class ModelJudge:
    """A judge backed by any batched text generator.

    Attributes:
        generate_fn: maps a list of prompts to a list of replies of the same length.
        prompt: the judge prompt; the paper's by default.
    """

    generate_fn: Callable[[list[str]], list[str]]
    prompt: JudgePrompt = PAPER_JUDGE_PROMPT

    def __post_init__(self) -> None:
        if not callable(self.generate_fn):
            raise TypeError("generate_fn must be callable: list[str] prompts -> list[str] replies")

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]:
        """Score ``items`` with one call to ``generate_fn``."""
        prompts = [build_judge_prompt(i.question, i.reference, i.answer, self.prompt) for i in items]
        if not prompts:
            return []
        replies = list(self.generate_fn(prompts))
        if len(replies) != len(prompts):
            raise ValueError(
                f"generate_fn returned {len(replies)} replies for {len(prompts)} prompts; "
                "it must return exactly one reply per prompt, in order"
            )
        return [parse_judge_score(str(reply)) for reply in replies]

    @classmethod
    def from_model(cls, loaded, max_new_tokens: int = 16, prompt: JudgePrompt = PAPER_JUDGE_PROMPT) -> ModelJudge:
        """A judge that is any model atp-jax loads, answering through its own greedy generation."""
        from atp_jax.inference.generate import generate_chat

        return cls(lambda prompts: generate_chat(loaded, prompts, max_new_tokens=max_new_tokens), prompt)


def _chat_completions_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def _verdict(body: bytes) -> JudgeScore:
    """The score in a chat-completions response body."""
    try:
        message = json.loads(body)["choices"][0]["message"]
        content = message.get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return JudgeScore(score=None, raw="", error=f"bad_response: {body[:200].decode('utf-8', 'replace')!r}")
    if not content:
        # Servers that split reasoning from the answer return it here, and no content, when the reply was
        # cut off while the judge was still reasoning.
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            return JudgeScore(score=None, raw=reasoning, error="unfinished_reasoning")
        content = ""
    if not isinstance(content, str):
        return JudgeScore(score=None, raw="", error=f"bad_response: message content is {type(content).__name__}")
    return parse_judge_score(content)


@dataclass(frozen=True)
class OpenAICompatibleJudge:
    """A judge served by an OpenAI-compatible chat-completions endpoint.

    Attributes:
        url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1/chat/completions`` is appended), a base
            ending in ``/v1``, or the full endpoint URL.
        model: the model name sent in each request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        prompt: the judge prompt; the paper's by default.
        policy: each request's total deadline and retries. An item whose request fails for good is
            ``JudgeScore(None, "", reason)``; the others of the batch are unaffected.
        max_concurrency: requests in flight at once.
        max_tokens: the reply length limit sent to the server; ``None`` leaves it to the server (useful for
            judges that reason before scoring).
    """

    url: str
    model: str
    api_key: str | None = None
    prompt: JudgePrompt = PAPER_JUDGE_PROMPT
    policy: RequestPolicy = field(default_factory=lambda: RequestPolicy(deadline=180.0, attempt_timeout=60.0))
    max_concurrency: int = 8
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if not self.model:
            raise ValueError("model must name the judge model served at url")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def endpoint(self) -> str:
        """The full chat-completions URL requests are sent to."""
        return _chat_completions_url(self.url)

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]:
        """Score ``items``; results are in the order of ``items``. Never raises for a failed request."""
        prompts = [build_judge_prompt(i.question, i.reference, i.answer, self.prompt) for i in items]
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(self._judge_prompt, prompts))

    def check(self, timeout: float = 10.0) -> None:
        """Sends one trivial item, without retries; raises ``ConnectionError`` naming the URL if the judge
        cannot answer (unreachable, refused, HTTP error). Run it before long work, not after."""
        probe_policy = replace(
            self.policy, max_retries=0, attempt_timeout=None, deadline=min(self.policy.deadline, timeout)
        )
        probe = replace(self, policy=probe_policy)
        verdict = probe._judge_prompt(build_judge_prompt("What is 2 + 2?", "4", "4", self.prompt))
        if verdict.error is not None and verdict.error not in REPLY_FAILURES:
            raise ConnectionError(
                f"judge at {self.endpoint} (model {self.model!r}) did not answer: {verdict.error}; "
                "check --judge_url and that the server is up, or drop the judge metric"
            )

    def _judge_prompt(self, prompt: str) -> JudgeScore:
        try:
            return self._request(prompt)
        except Exception as error:
            return JudgeScore(score=None, raw="", error=f"request_failed: {type(error).__name__}: {error}")

    def _request(self, prompt: str) -> JudgeScore:
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "seed": 0}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        result = post_json(self.endpoint, body, headers=headers, policy=self.policy)
        if not result.ok:
            return JudgeScore(score=None, raw="", error=result.error)
        return _verdict(result.body)
