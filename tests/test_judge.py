"""Tests for atp_jax.eval.judge and its HTTP transport, against a real local server with scripted failures."""

import contextlib
import hashlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from atp_jax.eval.judge import (
    PAPER_JUDGE_PROMPT,
    JudgeItem,
    JudgePrompt,
    JudgeScore,
    ModelJudge,
    OpenAICompatibleJudge,
    build_judge_prompt,
    parse_judge_score,
)
from atp_jax.http_client import RequestPolicy, post_json

ITEM = JudgeItem("which team won previous to crettyard?", ("Wolfe Tones",), "Wolfe Tones")

# The judge prompt of the paper (appendix A.1), copied character for character, with the trailing space after
# "score only." that the paper prints.
PAPER_PROMPT_TEXT = (
    "You are a text analyzer to analyze to what extent the assistant answer is aligned with the reference answer.\n"
    "\n"
    "Question: {question}. Reference answer: {reference_answer}. Assistant answer: {assistant_answer}.\n"
    "\n"
    "Please provide a score ranging from 0 to 1, where 1 represents perfect alignment and 0 represents no alignment"
    " at all. The final answer should contain the score only. "
)


# ------------------------------------------------------------------ prompt


def test_default_prompt_is_the_papers_word_for_word():
    assert PAPER_JUDGE_PROMPT.template == PAPER_PROMPT_TEXT
    assert PAPER_JUDGE_PROMPT.summary() == {
        "name": PAPER_JUDGE_PROMPT.name,
        "sha256": hashlib.sha256(PAPER_PROMPT_TEXT.encode("utf-8")).hexdigest(),
    }
    filled = build_judge_prompt("  how many wins?", ["3", "4"], " three \n")
    assert filled == (
        "You are a text analyzer to analyze to what extent the assistant answer is aligned with the reference answer.\n"
        "\n"
        "Question: how many wins?. Reference answer: 3 | 4. Assistant answer: three.\n"
        "\n"
        "Please provide a score ranging from 0 to 1, where 1 represents perfect alignment and 0 represents no "
        "alignment at all. The final answer should contain the score only. "
    )
    assert "table" not in filled.lower()


def test_another_prompt_is_an_explicit_choice_and_is_told_apart():
    short = JudgePrompt("short", "Q={question} R={reference_answer} A={assistant_answer} {{score}}?")
    seen = []
    ModelJudge(lambda prompts: seen.extend(prompts) or ["1"] * len(prompts), prompt=short).judge([ITEM])
    assert seen == ["Q=which team won previous to crettyard? R=Wolfe Tones A=Wolfe Tones {score}?"]
    assert short.summary()["sha256"] != PAPER_JUDGE_PROMPT.summary()["sha256"]
    assert OpenAICompatibleJudge("http://x", "m").prompt == PAPER_JUDGE_PROMPT == ModelJudge(list).prompt
    with pytest.raises(ValueError, match="needs exactly {question}, {reference_answer}, {assistant_answer}"):
        JudgePrompt("old", "Question: {question} Reference: {reference} Answer: {answer}")
    with pytest.raises(ValueError, match="double the braces"):
        JudgePrompt("broken", "{question} {reference_answer} {assistant_answer} {")


# ------------------------------------------------------------------ reading replies

SCORES = [
    # plain numbers
    ("0.8", 0.8),
    ("1", 1.0),
    ("0", 0.0),
    ("1.0", 1.0),
    (".5", 0.5),
    ("0.7.", 0.7),
    (" 0.35 \n", 0.35),
    # fractions and percents
    ("8/10", 0.8),
    ("3 / 4", 0.75),
    ("8 out of 10", 0.8),
    ("0.7/1.0", 0.7),
    ("80%", 0.8),
    ("100 %", 1.0),
    # decimal commas
    ("0,8", 0.8),
    ("Score: 0,25", 0.25),
    # markdown and labels
    ("**0.7**", 0.7),
    ("`0.6`", 0.6),
    ("Score: 0.7", 0.7),
    ("**Score:** 0.9", 0.9),
    ("**Rating:** 9/10", 0.9),
    ("The score is .5 because the answer names 2 of the 3 players.", 0.5),
    ("Score: 0.7. The answer lists 3 items.", 0.7),
    # sentences and scale descriptions
    ("On a scale of 0 to 1: 0.7", 0.7),
    ("Score (0-1): 0.8", 0.8),
    ("Between 0 and 1, I would give 1", 1.0),
    ("1 (on a scale from 0.0 to 1.0)", 1.0),
    ("The assistant answer matches 2 of the 3 items.\n0.67", 0.67),
    ("0.25\n\nThe answer is partly right (1 of 4).", 0.25),
    ("Final answer: \\boxed{0.6}", 0.6),
    # several numbers: the last one
    ("0.5, maybe 0.6", 0.6),
    ("Score: 8/10 = 0.8", 0.8),
    # reasoning blocks
    ("<think>The answer gives 2 teams; the reference 1.</think> 0.4", 0.4),
    ("<think>1? maybe 0</think>\n\n**0.2**", 0.2),
    ("The reference says 3, the answer 3 too.</think>\n1", 1.0),  # only the closing tag: opened in the prompt
]

FAILURES = [
    ("", "empty"),
    ("   \n ", "empty"),
    ("<think>all reasoning, then nothing</think>", "empty"),
    ("<think>The answer gives 2 teams, so", "unfinished_reasoning"),
    ("I cannot tell.", "unparsable"),
    ("Zero.", "unparsable"),
    ("0 to 1", "unparsable"),
    ("0/0", "unparsable"),
    ("1.5", "out_of_range"),
    ("5", "out_of_range"),
    ("8/5", "out_of_range"),
    ("120%", "out_of_range"),
    ("-0.2", "out_of_range"),
    ("Score: -1", "out_of_range"),
    ("On a scale of 0 to 10: 8", "out_of_range"),  # another scale is not guessed at
    ("<think> 0.9 </think> 2", "out_of_range"),
]


@pytest.mark.parametrize("reply, score", SCORES)
def test_reads_the_final_score(reply, score):
    parsed = parse_judge_score(reply)
    assert parsed.score == pytest.approx(score, abs=1e-12) and parsed.error is None and parsed.raw == reply


@pytest.mark.parametrize("reply, reason", FAILURES)
def test_a_reply_without_a_usable_score_is_none_with_its_reason(reply, reason):
    assert parse_judge_score(reply) == JudgeScore(score=None, raw=reply, error=reason)


def test_the_table_of_replies_is_large():
    assert len(SCORES) + len(FAILURES) >= 25


# ------------------------------------------------------------------ ModelJudge


def test_model_judge_calls_generate_once_and_keeps_order():
    calls = []

    def generate(prompts):
        calls.append(list(prompts))
        return ["1", "no idea", "0.5"]

    items = [ITEM, JudgeItem("q2", "r2", "a2"), JudgeItem("q3", "r3", "a3")]
    scores = ModelJudge(generate).judge(items)
    assert [s.score for s in scores] == [1.0, None, 0.5]
    assert scores[1].error == "unparsable"
    assert len(calls) == 1 and calls[0][1] == build_judge_prompt("q2", "r2", "a2")
    assert ModelJudge(generate).judge([]) == []


def test_model_judge_rejects_wrong_reply_count():
    with pytest.raises(ValueError, match="returned 1 replies for 2 prompts"):
        ModelJudge(lambda prompts: ["1"]).judge([ITEM, ITEM])
    with pytest.raises(TypeError, match="callable"):
        ModelJudge("not a function")


# ------------------------------------------------------------------ a real server with scripted behaviour


def _chat_body(content):
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class _RoomyHTTPServer(ThreadingHTTPServer):
    # socketserver's listen backlog is 5. A batch opens one connection per item at once; on a loaded machine
    # the accept loop falls behind, the kernel drops the surplus SYNs, and the client's attempt times out
    # before the server ever sees it, so the server counts fewer requests than the client made.
    request_queue_size = 128


class _Server:
    """A chat-completions server on 127.0.0.1 whose behaviour is scripted per request.

    ``scripts`` maps a key to the steps its successive requests get (the last step repeats); a request
    belongs to the first key its prompt contains (keys are not substrings of one another). Steps:

    * ``("reply", text)``: 200 with ``text`` as the message content; ``("body", bytes)``: 200 with that body.
    * ``("status", code, retry_after)``: that HTTP status with an error body (``Retry-After`` unless None).
    * ``("truncated",)``: a 200 whose Content-Length promises twice the bytes sent, then the connection closes.
    * ``("trickle", seconds, part)``: a good reply, written one byte every ``seconds``: the whole response
      (``part="all"``, headers included) or the body only (``part="body"``).
    * ``("stall", seconds)``: nothing at all for ``seconds``, then a good reply.
    * ``("garbage",)``: a response that is not HTTP.
    """

    def __init__(self, scripts, lifetime=30.0):
        self.scripts, self.requests, self.lock = dict(scripts), [], threading.Lock()
        self.release = threading.Event()  # wakes stalled or trickling handlers at shutdown
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                key = next((k for k in server.scripts if k in prompt), None)
                with server.lock:
                    count = sum(r["key"] == key for r in server.requests)
                    server.requests.append(
                        {
                            "key": key,
                            "time": time.monotonic(),
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                        }
                    )
                steps = server.scripts.get(key, [("reply", "1")])
                # A client that gave up (what a deadline is for) closes the socket under the reply.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._play(steps[min(count, len(steps) - 1)])

            def _play(self, step):
                kind = step[0]
                if kind == "stall":
                    server.release.wait(step[1])
                    kind, step = "reply", ("reply", "1")
                if kind in ("reply", "body"):
                    self._send(200, _chat_body(step[1]) if kind == "reply" else step[1])
                elif kind == "status":
                    extra = {} if step[2] is None else {"Retry-After": str(step[2])}
                    self._send(step[1], json.dumps({"error": f"scripted {step[1]}"}).encode(), extra)
                elif kind == "truncated":
                    data = _chat_body("1")
                    self._send(200, data[: len(data) // 2], length=2 * len(data))
                    self.close_connection = True
                elif kind == "trickle":
                    data = _chat_body("1")
                    head = (
                        f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                    ).encode()
                    if step[2] == "body":
                        self.wfile.write(head)
                    for byte in head + data if step[2] == "all" else data:
                        if server.release.wait(step[1]):
                            return
                        self.wfile.write(bytes([byte]))
                elif kind == "garbage":
                    self.wfile.write(b"this is not HTTP\r\n\r\n")
                    self.close_connection = True

            def _send(self, status, data, extra=(), length=None):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) if length is None else length))
                for name, value in dict(extra).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = _RoomyHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.watchdog = threading.Timer(lifetime, self.stop)

    def __enter__(self):
        self.thread.start()
        self.watchdog.start()
        return self

    def stop(self):
        self.release.set()
        self.httpd.shutdown()

    def __exit__(self, *exc):
        self.watchdog.cancel()
        self.stop()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def times(self, key):
        return [r["time"] for r in self.requests if r["key"] == key]


def _judge(url, *, deadline=5.0, attempt_timeout=None, max_retries=2, backoff=0.05, **kwargs):
    policy = RequestPolicy(deadline=deadline, attempt_timeout=attempt_timeout, max_retries=max_retries, backoff=backoff)
    return OpenAICompatibleJudge(url, "judge-model", policy=policy, **{"max_concurrency": 4, **kwargs})


def _closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_request_carries_the_papers_settings():
    with _Server({}) as server:
        scores = _judge(server.url, api_key="secret").judge([ITEM])
    assert scores == [JudgeScore(score=1.0, raw="1")]
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer secret"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["seed"] == 0
    assert body["messages"] == [
        {"role": "user", "content": build_judge_prompt(ITEM.question, ITEM.reference, ITEM.answer)}
    ]
    assert "max_tokens" not in body


DEADLINE = 3.0
MARGIN = 2.0  # what scheduling on a busy machine may add to a deadline; a trickling server would add many seconds


def test_a_batch_over_a_misbehaving_server_completes_with_every_failure_explained():
    scripts = {
        "good": [("reply", "0.9")],
        "fraction": [("reply", "Score: 8/10")],
        "flaky": [("status", 500, None), ("reply", "0.7")],
        "ratelimited": [("status", 429, 1), ("reply", "0.3")],
        "cutoff": [("truncated",), ("reply", "1")],
        "slowstart": [("trickle", 0.1, "body"), ("reply", "0.6")],
        "alwayscut": [("truncated",)],
        "down": [("status", 500, None)],
        "slowbody": [("trickle", 0.1, "body")],
        "slowhead": [("trickle", 0.1, "all")],
        "stall": [("stall", 20.0)],
        "unavailable": [("status", 503, 5)],
        "garbage": [("garbage",)],
        "notjson": [("body", b"<html>proxy error</html>")],
        "badkey": [("status", 401, None)],
        "nonsense": [("reply", "The answer looks right to me.")],
        "toohigh": [("reply", "1.5")],
        "thinking": [("reply", "<think>The reference says 3 and the answer")],
    }
    items = [JudgeItem(key, "ref", "answer") for key in scripts]
    # All requests start together, so the batch's wall time bounds every single item's.
    with _Server(scripts) as server:
        judge = _judge(server.url, deadline=DEADLINE, attempt_timeout=1.0, max_retries=3, max_concurrency=len(items))
        start = time.monotonic()
        scores = dict(zip(scripts, judge.judge(items)))
        elapsed = time.monotonic() - start
        count = {key: len(server.times(key)) for key in scripts}
        ratelimited = server.times("ratelimited")
    assert elapsed < DEADLINE + MARGIN

    # good answers and recovered retries get their scores
    assert {k: scores[k].score for k in ("good", "fraction", "flaky", "ratelimited", "cutoff", "slowstart")} == {
        "good": 0.9,
        "fraction": 0.8,
        "flaky": 0.7,
        "ratelimited": 0.3,
        "cutoff": 1.0,
        "slowstart": 0.6,
    }
    assert count["good"] == 1 and count["flaky"] == 2 and count["cutoff"] == 2 and count["slowstart"] == 2
    assert count["ratelimited"] == 2 and ratelimited[1] - ratelimited[0] >= 1.0  # Retry-After: 1 honoured

    # every failure is a null with its reason
    failed = {k: v for k, v in scores.items() if v.score is None}
    assert set(failed) == {
        "alwayscut",
        "down",
        "slowbody",
        "slowhead",
        "stall",
        "unavailable",
        "garbage",
        "notjson",
        "badkey",
        "nonsense",
        "toohigh",
        "thinking",
    }
    reason = {k: v.error.split(":")[0] for k, v in failed.items()}
    assert reason == {
        "alwayscut": "incomplete_read",
        "down": "http_500",
        "garbage": "protocol_error",
        "slowbody": "deadline_exceeded",
        "slowhead": "deadline_exceeded",
        "stall": "deadline_exceeded",
        "unavailable": "deadline_exceeded",
        "notjson": "bad_response",
        "badkey": "http_401",
        "nonsense": "unparsable",
        "toohigh": "out_of_range",
        "thinking": "unfinished_reasoning",
    }
    assert "gave up after 4 attempts" in failed["alwayscut"].error and count["alwayscut"] == 4
    assert "gave up after 4 attempts" in failed["down"].error and count["down"] == 4
    assert "Retry-After" in failed["unavailable"].error and count["unavailable"] == 1  # 5 s would pass the deadline
    assert count["badkey"] == 1 and count["notjson"] == 1 and count["nonsense"] == 1  # not worth retrying
    assert failed["nonsense"].raw == "The answer looks right to me." and failed["toohigh"].raw == "1.5"
    assert count["slowbody"] >= 2  # each attempt timed out and was retried until the deadline


@pytest.mark.parametrize("step", [("trickle", 0.1, "body"), ("trickle", 0.1, "all"), ("stall", 20.0)])
def test_no_request_outlives_its_deadline(step):
    policy = RequestPolicy(deadline=DEADLINE, max_retries=3, backoff=0.05)
    with _Server({"slow": [step]}) as server:
        url = server.url + "/v1/chat/completions"
        payload = {"messages": [{"role": "user", "content": "slow"}]}

        def timed(_):
            start = time.monotonic()
            result = post_json(url, payload, policy=policy)
            return result, time.monotonic() - start

        with ThreadPoolExecutor(3) as pool:
            outcomes = list(pool.map(timed, range(3)))
    for result, seconds in outcomes:
        assert result.error.startswith("deadline_exceeded") and result.status is None and result.attempts == 1
        assert DEADLINE - 0.05 <= result.seconds <= seconds < DEADLINE + MARGIN  # its own clock agrees


def test_a_server_that_recovers_within_the_deadline_is_waited_for():
    with _Server({"busy": [("status", 503, 1), ("status", 502, None), ("reply", "0.5")]}) as server:
        start = time.monotonic()
        result = post_json(
            server.url + "/v1/chat/completions",
            {"messages": [{"content": "busy"}]},
            policy=RequestPolicy(deadline=6.0, backoff=0.05),
        )
        elapsed = time.monotonic() - start
    assert result.ok and result.status == 200 and result.attempts == 3
    assert json.loads(result.body)["choices"][0]["message"]["content"] == "0.5"
    assert 1.0 <= elapsed < 6.0


def test_connection_refused_is_reported():
    scores = _judge(f"http://127.0.0.1:{_closed_port()}", max_retries=1).judge([ITEM])
    assert scores[0].score is None and scores[0].error.startswith("connection_error")
    assert "gave up after 2 attempts" in scores[0].error


def test_many_items_keep_their_order():
    items = [JudgeItem(f"item{k:02d}", f"r{k}", f"a{k}") for k in range(12)]
    scripts = {f"item{k:02d}": [("reply", f"{k / 20}")] for k in range(12)}
    with _Server(scripts) as server:
        scores = _judge(server.url, max_concurrency=3).judge(items)
    assert [s.score for s in scores] == [k / 20 for k in range(12)]


def test_configuration_errors():
    with pytest.raises(ValueError, match="http:// or https://"):
        OpenAICompatibleJudge("localhost:8000", "m")
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAICompatibleJudge("http://x", "m", max_concurrency=0)
    with pytest.raises(ValueError, match="deadline"):
        RequestPolicy(deadline=0)
    with pytest.raises(ValueError, match="attempt_timeout"):
        RequestPolicy(attempt_timeout=-1)
    with pytest.raises(ValueError, match="http://host:port/path"):
        post_json("ftp://x/y", {})
    assert OpenAICompatibleJudge("http://x/v1/chat/completions", "m").endpoint == "http://x/v1/chat/completions"
    assert OpenAICompatibleJudge("http://x/", "m").endpoint == "http://x/v1/chat/completions"
    assert OpenAICompatibleJudge("http://x/v1", "m").endpoint == "http://x/v1/chat/completions"


def test_check_passes_on_a_live_server_even_with_an_unparsable_reply():
    with _Server({"2 + 2": [("reply", "sure")]}) as server:
        _judge(server.url).check()
    assert len(server.requests) == 1


def test_check_names_the_url_of_a_refusing_or_failing_judge():
    port = _closed_port()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}.*connection_error"):
        _judge(f"http://127.0.0.1:{port}").check()
    with _Server({"2 + 2": [("status", 500, None)]}) as server:
        with pytest.raises(ConnectionError, match="http_500"):
            _judge(server.url).check()
        assert len(server.requests) == 1  # a check never retries
