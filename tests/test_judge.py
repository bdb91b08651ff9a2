"""Tests for atp_jax.eval.judge, including the HTTP backend against a local server."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from atp_jax.eval.judge import (
    JUDGE_PROMPT,
    JudgeItem,
    JudgeScore,
    ModelJudge,
    OpenAICompatibleJudge,
    build_judge_prompt,
    parse_judge_score,
)

ITEM = JudgeItem("which team won previous to crettyard?", ("Wolfe Tones",), "Wolfe Tones")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # urllib honours proxy variables; the local test server must be reached directly.
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------------ prompt and parsing


def test_prompt_holds_question_reference_and_answer_but_no_table():
    prompt = build_judge_prompt("how many wins?", ["3", "4"], "  three  ")
    assert "Question: how many wins?" in prompt
    assert "Reference answer: 3 | 4" in prompt
    assert "Assistant's answer: three" in prompt
    assert "between 0 and 1" in prompt
    assert set(JUDGE_PROMPT.count(f"{{{name}}}") for name in ("question", "reference", "answer")) == {1}
    assert "{table}" not in JUDGE_PROMPT


@pytest.mark.parametrize(
    "reply, score",
    [
        ("0.8", 0.8),
        ("1", 1.0),
        ("Score: 0", 0.0),
        ("The score is .5 because ...", 0.5),
        ("1.5", 1.0),  # clamped
        ("-0.2", 0.0),  # clamped
        ("0.25\n\nThe answer is partly right (1 of 4).", 0.25),  # the first number counts
    ],
)
def test_parse_judge_score(reply, score):
    assert parse_judge_score(reply) == JudgeScore(score=score, raw=reply)


def test_unparsable_reply_is_not_zero():
    result = parse_judge_score("I cannot tell.")
    assert result.score is None and result.error == "unparsable" and result.raw == "I cannot tell."


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


# ------------------------------------------------------------------ HTTP backend


class _Server:
    """A local chat-completions server whose replies follow a per-request script.

    Each script step is ``(status, content)`` or ``("sleep", seconds)``; the last step
    repeats. It listens on 127.0.0.1 only and shuts itself down after ``lifetime`` seconds
    if a test forgets to.
    """

    def __init__(self, script, lifetime=30.0):
        self.script, self.requests, self.lock = list(script), [], threading.Lock()
        self.release = threading.Event()  # Wakes sleeping handlers at shutdown.
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    step = server.script[min(len(server.requests), len(server.script) - 1)]
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                kind, value = step
                if kind == "sleep":
                    server.release.wait(value)
                    kind, value = 200, "1"
                if kind == 200:
                    payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": value}}]})
                else:
                    payload = json.dumps({"error": value})
                data = payload.encode()
                try:
                    self.send_response(kind)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # The client gave up (timeout test).

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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


def _judge(url, **kwargs):
    options = dict(model="judge-model", timeout=2.0, max_retries=2, backoff=0.01, max_concurrency=4)
    options.update(kwargs)
    return OpenAICompatibleJudge(url, **options)


def test_http_success_and_request_format():
    with _Server([(200, "0.9")]) as server:
        scores = _judge(server.url, api_key="secret").judge([ITEM])
    assert scores == [JudgeScore(score=0.9, raw="0.9")]
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer secret"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["seed"] == 0
    expected_prompt = build_judge_prompt(ITEM.question, ITEM.reference, ITEM.answer)
    assert body["messages"] == [{"role": "user", "content": expected_prompt}]
    assert "max_tokens" not in body


def test_http_500_is_retried():
    with _Server([(500, "overloaded"), (200, "1")]) as server:
        scores = _judge(server.url).judge([ITEM])
    assert scores[0].score == 1.0 and scores[0].error is None
    assert len(server.requests) == 2


def test_http_errors_after_retries_and_non_retryable_codes():
    with _Server([(503, "down")]) as server:
        scores = _judge(server.url, max_retries=1).judge([ITEM])
    assert scores[0].score is None and scores[0].error.startswith("http 503")
    assert len(server.requests) == 2  # first attempt + one retry

    with _Server([(401, "bad key")]) as server:
        scores = _judge(server.url + "/v1").judge([ITEM])
    assert scores[0].score is None and scores[0].error.startswith("http 401")
    assert len(server.requests) == 1  # not retried


def test_http_timeout():
    with _Server([("sleep", 5.0)]) as server:
        start = time.monotonic()
        scores = _judge(server.url, timeout=0.3, max_retries=1).judge([ITEM])
        elapsed = time.monotonic() - start
    assert scores == [JudgeScore(score=None, raw="", error="timeout")]
    assert len(server.requests) == 2
    assert elapsed < 3


def test_http_unparsable_reply():
    with _Server([(200, "The answer looks right to me.")]) as server:
        scores = _judge(server.url).judge([ITEM])
    assert scores[0].score is None and scores[0].error == "unparsable"
    assert scores[0].raw == "The answer looks right to me."
    assert len(server.requests) == 1  # a parsed reply is final; no retry


def test_http_many_items_keep_their_order():
    items = [JudgeItem(f"q{k}", f"r{k}", f"a{k}") for k in range(12)]
    with _Server([(200, "0.5")]) as server:
        scores = _judge(server.url, max_concurrency=3).judge(items)
    assert [s.score for s in scores] == [0.5] * 12
    assert sorted(r["body"]["messages"][0]["content"] for r in server.requests) == sorted(
        build_judge_prompt(i.question, i.reference, i.answer) for i in items
    )


def test_connection_refused_is_reported():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scores = _judge(f"http://127.0.0.1:{port}", max_retries=0).judge([ITEM])
    assert scores[0].score is None and scores[0].error.startswith("connection error")


def test_judge_configuration_errors():
    with pytest.raises(ValueError, match="http:// or https://"):
        OpenAICompatibleJudge("localhost:8000", "m")
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAICompatibleJudge("http://x", "m", max_concurrency=0)
    assert OpenAICompatibleJudge("http://x/v1/chat/completions", "m").endpoint == "http://x/v1/chat/completions"
    assert OpenAICompatibleJudge("http://x/", "m").endpoint == "http://x/v1/chat/completions"


def test_check_passes_on_a_live_server_even_with_an_unparsable_reply():
    with _Server([(200, "sure")]) as server:
        _judge(server.url).check()
    assert len(server.requests) == 1


def test_check_names_the_url_of_a_refusing_or_failing_judge():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}.*connection error"):
        _judge(f"http://127.0.0.1:{port}").check()
    with _Server([(401, "bad key")]) as server:
        with pytest.raises(ConnectionError, match="http 401"):
            _judge(server.url).check()
        assert len(server.requests) == 1  # a check never retries
