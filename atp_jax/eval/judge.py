"""LLM-as-judge scoring of answers against a reference answer.

The judge sees the question, the reference answer and the assistant's answer — never
the table — and replies with a score between 0 and 1 (:data:`JUDGE_PROMPT`). The
first number in the reply is taken as the score and clamped to [0, 1]. A reply
without a number is recorded as ``JudgeScore(score=None, error="unparsable")`` rather
than as 0, so that judge failures are not counted as wrong answers.

Two backends share one interface, ``judge(items) -> list[JudgeScore]``:

* :class:`ModelJudge` wraps any ``generate_fn(prompts: list[str]) -> list[str]``, e.g.
  a local model's batched greedy generation.
* :class:`OpenAICompatibleJudge` calls an OpenAI-compatible ``/v1/chat/completions``
  endpoint with the standard library (``urllib``), several requests at a time, with
  temperature 0, seed 0, and retries with exponential backoff.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

__all__ = [
    "JUDGE_PROMPT",
    "JudgeItem",
    "JudgeScore",
    "Judge",
    "build_judge_prompt",
    "parse_judge_score",
    "ModelJudge",
    "OpenAICompatibleJudge",
]

# The paper (appendix A.1) gives the judge the question, the reference answer and the
# assistant's answer, without the table, and asks for a score between 0 and 1. Its exact
# wording was not available to us; this prompt follows that description.
JUDGE_PROMPT = """\
You are an impartial judge of answers to questions about a table. You are given a \
question, the reference answer, and an assistant's answer. You are not shown the table: \
judge only whether the assistant's answer agrees with the reference answer.

Score the assistant's answer between 0 and 1:
- 1 if it gives the same answer as the reference. Differences in wording, formatting, \
capitalisation, number formatting or units that do not change the meaning, and extra \
explanation that does not contradict the reference, do not matter.
- 0 if it gives a different answer, contradicts the reference, or gives no answer.
- A value in between if it is partly correct, e.g. only some of the items of a \
multi-part reference answer.

Question: {question}

Reference answer: {reference}

Assistant's answer: {answer}

Reply with the score only, a single number between 0 and 1."""

_REFERENCE_SEPARATOR = " | "
_FIRST_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


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
        error: ``None`` on success; ``"unparsable"`` for a reply without a number; a short
            description (e.g. ``"timeout"``, ``"http 401: ..."``) when the request failed.
    """

    score: float | None
    raw: str
    error: str | None = None


class Judge(Protocol):
    """Anything that scores a batch of answers."""

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]: ...


def build_judge_prompt(question: str, reference: str | Sequence[str], answer: str) -> str:
    """Fill :data:`JUDGE_PROMPT`; a list of reference answers is joined with " | "."""
    if not isinstance(reference, str):
        reference = _REFERENCE_SEPARATOR.join(reference)
    return JUDGE_PROMPT.format(question=question.strip(), reference=reference.strip(),
                               answer=answer.strip())


def parse_judge_score(reply: str) -> JudgeScore:
    """Take the first number in ``reply`` as the score, clamped to [0, 1].

    A reply with no number gives ``JudgeScore(None, reply, "unparsable")``.
    """
    match = _FIRST_NUMBER.search(reply)
    if match is None:
        return JudgeScore(score=None, raw=reply, error="unparsable")
    value = float(match.group(0))
    return JudgeScore(score=min(1.0, max(0.0, value)), raw=reply)


def _prompt_for(item: JudgeItem) -> str:
    return build_judge_prompt(item.question, item.reference, item.answer)


@dataclass(frozen=True)
class ModelJudge:
    """A judge backed by any batched text generator.

    Attributes:
        generate_fn: maps a list of prompts to a list of replies of the same length.
    """

    generate_fn: Callable[[list[str]], list[str]]

    def __post_init__(self) -> None:
        if not callable(self.generate_fn):
            raise TypeError("generate_fn must be callable: list[str] prompts -> list[str] replies")

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]:
        """Score ``items`` with one call to ``generate_fn``."""
        prompts = [_prompt_for(item) for item in items]
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
    def from_model(cls, loaded, max_new_tokens: int = 16) -> ModelJudge:
        """A judge that is any model atp-jax loads, answering through its own greedy generation."""
        from atp_jax.eval.generate import generate_chat

        return cls(lambda prompts: generate_chat(loaded, prompts, max_new_tokens=max_new_tokens))


class _RetryableError(Exception):
    """A failure worth retrying (timeout, connection error, HTTP 429 or 5xx)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _PermanentError(Exception):
    """A failure that retrying will not fix (HTTP 4xx other than 429, malformed reply)."""


def _chat_completions_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


@dataclass(frozen=True)
class OpenAICompatibleJudge:
    """A judge served by an OpenAI-compatible chat-completions endpoint.

    Attributes:
        url: the server, e.g. ``http://127.0.0.1:8000`` (``/v1/chat/completions`` is
            appended), a base ending in ``/v1``, or the full endpoint URL.
        model: the model name sent in each request.
        api_key: sent as ``Authorization: Bearer <api_key>`` when given.
        timeout: seconds to wait for one HTTP response.
        max_retries: retries after the first attempt for timeouts, connection errors and
            HTTP 429/5xx. Other HTTP errors (e.g. 400, 401) are not retried.
        max_concurrency: requests in flight at once.
        backoff: seconds before the first retry; doubled at every further retry.
        max_backoff: the longest wait between retries, also for ``Retry-After``.
        max_tokens: the reply length limit sent to the server; ``None`` leaves it to
            the server (useful for judges that reason before scoring).
    """

    url: str
    model: str
    api_key: str | None = None
    timeout: float = 60.0
    max_retries: int = 3
    max_concurrency: int = 8
    backoff: float = 1.0
    max_backoff: float = 30.0
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if not self.model:
            raise ValueError("model must name the judge model served at url")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff and max_backoff must be >= 0")

    @property
    def endpoint(self) -> str:
        """The full chat-completions URL requests are sent to."""
        return _chat_completions_url(self.url)

    def judge(self, items: Sequence[JudgeItem]) -> list[JudgeScore]:
        """Score ``items``; results are in the order of ``items``."""
        prompts = [_prompt_for(item) for item in items]
        if not prompts:
            return []
        workers = min(self.max_concurrency, len(prompts))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(self._judge_prompt, prompts))

    def check(self, timeout: float = 10.0) -> None:
        """Sends one trivial item, without retries; raises ``ConnectionError`` naming the URL if the judge
        cannot answer (unreachable, refused, HTTP error). Run it before long work, not after."""
        probe = replace(self, max_retries=0, timeout=min(self.timeout, timeout))
        verdict = probe._judge_prompt(_prompt_for(JudgeItem("What is 2 + 2?", "4", "4")))
        if verdict.error is not None and verdict.error != "unparsable":
            raise ConnectionError(f"judge at {self.endpoint} (model {self.model!r}) did not answer: {verdict.error}; "
                                  "check --judge_url and that the server is up, or drop the judge metric")

    def _judge_prompt(self, prompt: str) -> JudgeScore:
        attempt = 0
        while True:
            try:
                reply = self._request(prompt)
            except _RetryableError as error:
                if attempt >= self.max_retries:
                    return JudgeScore(score=None, raw="", error=str(error))
                delay = self.backoff * (2**attempt)
                if error.retry_after is not None:
                    delay = max(delay, error.retry_after)
                time.sleep(min(delay, self.max_backoff))
                attempt += 1
                continue
            except _PermanentError as error:
                return JudgeScore(score=None, raw="", error=str(error))
            return parse_judge_score(reply)

    def _request(self, prompt: str) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "seed": 0,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.endpoint, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read(500).decode("utf-8", "replace").strip()
            message = f"http {error.code}: {detail}" if detail else f"http {error.code}"
            if error.code == 429 or error.code >= 500:
                raise _RetryableError(message, _retry_after_seconds(error)) from None
            raise _PermanentError(message) from None
        except TimeoutError:
            raise _RetryableError("timeout") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise _RetryableError("timeout") from None
            raise _RetryableError(f"connection error: {error.reason}") from None
        except ConnectionError as error:
            raise _RetryableError(f"connection error: {error}") from None
        try:
            content = json.loads(payload)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _PermanentError(
                f"bad response: {payload[:200].decode('utf-8', 'replace')!r}"
            ) from None
        if not isinstance(content, str):
            raise _PermanentError(f"bad response: message content is {type(content).__name__}")
        return content


def _retry_after_seconds(error: urllib.error.HTTPError) -> float | None:
    value = error.headers.get("Retry-After") if error.headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # An HTTP date; the exponential backoff is used instead.
