"""A victim behind an OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp's servers, a hosted API).

``ServerVictim`` answers the two questions the attacks ask of a model — the reference answer's cross-entropy
under an order, and the model's answer — over HTTP, in one of three endpoint kinds:

* ``echo``: ``/v1/completions`` with ``echo``, ``logprobs=0`` and ``max_tokens=1``: the server returns the
  log-probability of every prompt token, and the answer's CE is read off its last tokens; one request per order.
  The OpenAI protocol vLLM follows.
* ``forced``: ``/v1/completions`` once per answer token j: the prompt and the answer's first j tokens, with
  ``max_tokens=1``, ``logprobs=1`` and a logit bias of +100 on answer token j, so greedy decoding emits exactly
  that token and the server reports its log-probability. The bias acts in the sampler, after the logits the
  log-probability is read from (llama-cpp-python, vLLM), so the value is the unbiased one. For servers whose
  echoed log-probabilities are misaligned: llama-cpp-python pairs each prompt token with the distribution *after*
  it unless the prompt starts with the model's BOS token (abetlen/llama-cpp-python#1983), which Qwen's chat
  template does not; llama.cpp's own server returns none for the prompt.
* ``chat``: ``/v1/chat/completions`` with the prompt's messages; the server applies its own chat template. The
  answer only: no CE (hosted chat APIs).
* ``auto``: ``echo`` where it agrees with ``forced`` on the first prompt it meets and answers faster
  (``calibrate``), else ``forced``. llama-cpp-python sorts the whole vocabulary in Python for every echoed token,
  which takes seconds to minutes per prompt: there ``forced`` wins.

For the completions kinds the prompt is exactly the local path's: the chat template rendered by the local
tokenizer (``render_prompt``), sent as text, plus the reference answer's text. The server tokenizes it again; its
token count (``usage.prompt_tokens``) must equal the local tokenizer's, else the request fails with a message
saying the tokenizers differ, since the CE would be of another token sequence.

Every reply is cached by the exact request (``cache_path``: a JSON-lines file, so a rerun repeats no request);
requests run ``max_concurrency`` at a time under ``policy`` (a total deadline and retries per request: the judge's
transport). A request that fails for good raises ``VictimError``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from atp_jax import jsonl
from atp_jax.http_client import RequestPolicy, post_json
from atp_jax.tables.linearize import linearize
from atp_jax.tables.prompt import (
    PromptStyle,
    chat_messages,
    encode_text,
    extract_answer,
    reference_answer,
    render_prompt,
)
from atp_jax.tables.table import Example, Table

ENDPOINTS = ("auto", "echo", "forced", "chat")
FORCING_BIAS = 100.0  # added to the forced token's logit: greedy then always picks it
# nats: echo and forced CE of one prompt closer than this agree. One server gives both from the same weights but
# different batch shapes (a prompt at once vs one token at a time), which moves a quantized model's CE by ~0.01; a
# misaligned echo is off by nats.
CALIBRATION_TOLERANCE = 0.05


class VictimError(ConnectionError):
    """A request to the victim server that failed for good, or a reply that cannot be read or does not match the
    prompt sent; the message names the server and the cause."""


@dataclasses.dataclass(frozen=True)
class ServerStats:
    """Requests sent, replies served from the cache, seconds waited on the server."""

    requests: int = 0
    cache_hits: int = 0
    seconds: float = 0.0

    def __sub__(self, other: ServerStats) -> ServerStats:
        return ServerStats(
            self.requests - other.requests, self.cache_hits - other.cache_hits, self.seconds - other.seconds
        )

    def as_dict(self) -> dict:
        return {"requests": self.requests, "cache_hits": self.cache_hits, "seconds": round(self.seconds, 3)}


def _api_url(url: str, path: str) -> str:
    """``path`` (``completions``, ``chat/completions``, ``models``) under the server's ``/v1``."""
    url = url.rstrip("/")
    for known in ("/chat/completions", "/completions"):
        if url.endswith(known):
            url = url[: -len(known)]
    return f"{url}/{path}" if url.endswith("/v1") else f"{url}/v1/{path}"


class ServerVictim:
    """A model served at ``url`` under ``name``, queried through ``endpoint`` (see the module docstring).

    ``tokenizer``: the served model's tokenizer (``atp_jax.models.loading.load_tokenizer``): renders the chat
    template for the completions kinds and splits the reference answer into tokens; not needed by ``chat``.
    ``api_key`` is sent as a bearer token and never recorded. ``cache_path``: where replies are kept across runs
    (None: in memory only).
    """

    def __init__(
        self,
        url: str,
        name: str,
        endpoint: str = "auto",
        tokenizer=None,
        *,
        api_key: str | None = None,
        policy: RequestPolicy = RequestPolicy(deadline=120.0, attempt_timeout=60.0, max_retries=2),
        max_concurrency: int = 4,
        cache_path: str | Path | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"victim url must start with http:// or https://, got {url!r}")
        if endpoint not in ENDPOINTS:
            raise ValueError(f"victim endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        if endpoint != "chat" and tokenizer is None:
            raise ValueError(
                f"the {endpoint!r} endpoint renders the prompt with the served model's tokenizer: pass one "
                "(--model or --tokenizer naming the served model), or use the 'chat' endpoint"
            )
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.url, self.name, self.endpoint, self.tokenizer = url, name, endpoint, tokenizer
        self.policy, self.max_concurrency = policy, max_concurrency
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._lock = threading.Lock()
        self._stats = ServerStats()
        self.calibration: dict | None = None
        self.cache_path = None if cache_path is None else Path(cache_path)
        self._cache: dict[str, object] = {}
        if self.cache_path is not None:
            self._cache = {entry["key"]: entry["value"] for _, entry in jsonl.read(self.cache_path, "cached reply")}

    # ------------------------------------------------------------------ what a run records

    def describe(self) -> dict:
        """The victim as a results folder's identity names it (the requested endpoint kind; no key)."""
        return {"url": self.url, "name": self.name, "endpoint": self.endpoint}

    @property
    def has_logprobs(self) -> bool:
        """Whether the reference answer's CE can be measured (every kind but ``chat``)."""
        return self.endpoint != "chat"

    def stats(self) -> ServerStats:
        with self._lock:
            return self._stats

    # ------------------------------------------------------------------ the oracle

    def check(self, timeout: float = 10.0) -> None:
        """One short request, no retries; ``VictimError`` naming the URL when the server does not answer."""
        probe = dataclasses.replace(self.policy, max_retries=0, attempt_timeout=None, deadline=timeout)
        if self.endpoint == "chat":
            url, body = _api_url(self.url, "chat/completions"), {"messages": [{"role": "user", "content": "Hi"}]}
        else:
            url, body = _api_url(self.url, "completions"), {"prompt": "Hi"}
        result = post_json(url, {"model": self.name, "max_tokens": 1, **body}, headers=self._headers, policy=probe)
        if not result.ok:
            raise VictimError(
                f"victim server at {url} (model {self.name!r}) did not answer: {result.error}; check --victim_url, "
                "--victim_name and that the server is up"
            )

    def answer_losses(
        self, example: Example, tables: Sequence[Table], style: PromptStyle = PromptStyle()
    ) -> np.ndarray:
        """Mean token cross-entropy of the reference answer under each table ``[K]``, as ``inference.qa.answer_losses``
        computes it in process."""
        if not self.has_logprobs:
            raise ValueError("the 'chat' endpoint returns no log-probabilities; the CE objective needs echo or forced")
        if self.endpoint == "auto":
            self.calibrate(example, style)
        prompts = [render_prompt(self.tokenizer, example, t, style).text for t in tables]
        answer = reference_answer(example)
        route = self._echo_logprobs if self.endpoint == "echo" else self._forced_logprobs
        return np.asarray(self._map(lambda prompt: -np.mean(route(prompt, answer)), prompts), np.float64)

    def answers(
        self, example: Example, tables: Sequence[Table], style: PromptStyle = PromptStyle(), max_new_tokens: int = 32
    ) -> list[str]:
        """The model's answers (greedy, extracted as in process) for the example under each table."""
        if self.endpoint == "chat":

            def work(table: Table) -> str:
                messages = chat_messages(example, linearize(table, style.linearization).text, style)
                body = {"messages": messages, "max_tokens": max_new_tokens, "temperature": 0, "seed": 0}
                reply = self._query("chat/completions", body, _chat_text)
                return extract_answer(reply, style)
        else:

            def work(table: Table) -> str:
                prompt = render_prompt(self.tokenizer, example, table, style).text
                body = {"prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0, "seed": 0}
                return extract_answer(self._query("completions", body, _completion_text), style)

        return self._map(work, list(tables))

    def calibrate(self, example: Example, style: PromptStyle = PromptStyle()) -> dict:
        """Resolves ``auto`` on the example's original prompt: ``forced`` unless the echoed CE agrees with it within
        ``CALIBRATION_TOLERANCE`` and came back faster (llama-cpp-python sorts the whole vocabulary in Python for
        every echoed token, so a short answer is cheaper forced). Returns (and keeps, as ``calibration``) both
        values, their seconds and the choice; the choice is cached with the replies, so a rerun makes the same one.
        """
        if self.endpoint != "auto":
            return self.calibration or {}
        key = f"calibration {_api_url(self.url, 'completions')} {self.name}"
        if key not in self._cache:
            prompt = render_prompt(self.tokenizer, example, None, style).text
            answer = reference_answer(example)
            start = time.perf_counter()
            forced_ce = float(-np.mean(self._forced_logprobs(prompt, answer)))
            forced_s = time.perf_counter() - start
            # Echo only has to beat forced: it gets a few times forced's time, once, and a miss means forced.
            echo_policy = dataclasses.replace(
                self.policy, deadline=max(10.0, 4 * forced_s), attempt_timeout=None, max_retries=0
            )
            start = time.perf_counter()
            try:
                echo_ce = float(-np.mean(self._echo_logprobs(prompt, answer, echo_policy)))
            except VictimError as e:
                echo_ce, echo_error = None, str(e)
            else:
                echo_error = None
            # Rounded before the choice, so that the recorded seconds alone say why it was made.
            echo_s, forced_s = round(time.perf_counter() - start, 3), round(forced_s, 3)
            agree = echo_ce is not None and abs(echo_ce - forced_ce) <= CALIBRATION_TOLERANCE
            self._remember(
                key,
                {
                    "example": example.id,
                    "echo_ce": echo_ce,
                    "forced_ce": forced_ce,
                    "echo_seconds": echo_s,
                    "forced_seconds": forced_s,
                    "echo_error": echo_error,
                    "chosen": "echo" if agree and echo_s < forced_s else "forced",
                },
            )
        self.calibration = self._cache[key]
        self.endpoint = self.calibration["chosen"]
        return self.calibration

    # ------------------------------------------------------------------ the two log-probability routes

    def _expected_tokens(self, text: str) -> int:
        return len(encode_text(self.tokenizer, text))

    def _echo_logprobs(self, prompt: str, answer: str, policy: RequestPolicy | None = None) -> list[float]:
        """Log-probabilities of the answer's tokens from one echoed request."""
        answer_ids = encode_text(self.tokenizer, answer)
        body = {"prompt": prompt + answer, "max_tokens": 1, "temperature": 0}
        reply = self._query("completions", {**body, "echo": True, "logprobs": 0}, _echo_reply, policy)
        self._check_count(reply["prompt_tokens"], self._expected_tokens(prompt) + len(answer_ids))
        logprobs = reply["token_logprobs"]
        end = len(logprobs) - reply["completion_tokens"]
        values = logprobs[end - len(answer_ids) : end]
        if len(values) != len(answer_ids) or any(v is None for v in values):
            raise VictimError(f"victim at {self.url}: the echoed log-probabilities do not cover the answer's tokens")
        return values

    def _forced_logprobs(self, prompt: str, answer: str) -> list[float]:
        """Log-probabilities of the answer's tokens, one forced request each."""
        answer_ids = encode_text(self.tokenizer, answer)
        expected = self._expected_tokens(prompt)

        def one(j: int) -> float:
            text = prompt + self.tokenizer.decode(answer_ids[:j], clean_up_tokenization_spaces=False)
            body = {
                "prompt": text,
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": 1,
                "logit_bias": {str(answer_ids[j]): FORCING_BIAS},
            }
            reply = self._query("completions", body, _forced_reply)
            self._check_count(reply["prompt_tokens"], expected + j)
            return reply["logprob"]

        return [one(j) for j in range(len(answer_ids))]  # in order: a server reuses the shared prefix's cache

    def _check_count(self, served: int | None, local: int) -> None:
        if served is not None and served != local:
            raise VictimError(
                f"victim at {self.url} tokenized the prompt into {served} tokens, the local tokenizer into {local}: "
                "the server's model or tokenizer is not the one --model/--tokenizer names (or it adds a BOS token "
                "the chat template already has), so its CE would be of another token sequence"
            )

    # ------------------------------------------------------------------ transport and cache

    def _map(self, fn: Callable, items: list) -> list:
        if self.max_concurrency == 1 or len(items) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    def _query(self, path: str, body: dict, read: Callable[[dict], object], policy: RequestPolicy | None = None):
        """``read(reply)`` for the request ``body`` to ``path`` (under ``policy``, default the victim's), from the
        cache when the same request was sent before (by this or an earlier run: the key is the URL, model and
        body)."""
        url = _api_url(self.url, path)
        payload = {"model": self.name, **body}
        key = hashlib.sha256(json.dumps({"url": url, "payload": payload}, sort_keys=True).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._stats = dataclasses.replace(self._stats, cache_hits=self._stats.cache_hits + 1)
                return self._cache[key]
        start = time.perf_counter()
        result = post_json(url, payload, headers=self._headers, policy=policy or self.policy)
        with self._lock:
            self._stats = dataclasses.replace(
                self._stats,
                requests=self._stats.requests + 1,
                seconds=self._stats.seconds + time.perf_counter() - start,
            )
        if not result.ok:
            raise VictimError(f"victim at {url} (model {self.name!r}): {result.error}")
        try:
            value = read(json.loads(result.body))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise VictimError(
                f"victim at {url}: a reply without the expected fields ({type(e).__name__}: {e}): "
                f"{result.body[:200].decode('utf-8', 'replace')!r}"
            ) from None
        self._remember(key, value)
        return value

    def _remember(self, key: str, value) -> None:
        with self._lock:
            self._cache[key] = value
            if self.cache_path is not None:
                jsonl.append(self.cache_path, {"key": key, "value": value})


def _usage(reply: dict, field: str) -> int | None:
    usage = reply.get("usage") or {}
    return int(usage[field]) if field in usage else None


def _echo_reply(reply: dict) -> dict:
    logprobs = reply["choices"][0]["logprobs"]
    values = [None if v is None else float(v) for v in logprobs["token_logprobs"]]
    completion = _usage(reply, "completion_tokens")
    return {
        "token_logprobs": values,
        "prompt_tokens": _usage(reply, "prompt_tokens"),
        "completion_tokens": 1 if completion is None else completion,
    }


def _forced_reply(reply: dict) -> dict:
    return {
        "logprob": float(reply["choices"][0]["logprobs"]["token_logprobs"][0]),
        "prompt_tokens": _usage(reply, "prompt_tokens"),
    }


def _completion_text(reply: dict) -> str:
    return str(reply["choices"][0]["text"])


def _chat_text(reply: dict) -> str:
    return str(reply["choices"][0]["message"]["content"] or "")
