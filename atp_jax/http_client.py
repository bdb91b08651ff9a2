"""JSON POST requests with a total deadline, retries with backoff, and failures returned rather than raised.

``post_json(url, payload, policy=RequestPolicy(...))`` sends one request and returns an :class:`HttpResult`;
it never raises for anything the network or the server does. Its guarantees:

* **A total deadline.** ``policy.deadline`` bounds the wall clock of the whole request: connecting, sending,
  every read of every attempt, and the waits between attempts. A socket timeout alone bounds only one read,
  so a server that trickles bytes could hold a request indefinitely; here a watchdog shuts the connection
  down when the attempt's time is up, whatever phase it is in. (Name resolution is the one step the
  operating system does not let us interrupt; use an IP address where that matters.)
* **Retries.** Timeouts of one attempt (``policy.attempt_timeout``), refused or reset connections, bodies
  cut short (``IncompleteRead``), responses that break HTTP, and HTTP 408, 429 and 5xx are retried up to
  ``policy.max_retries`` times with exponential backoff; a ``Retry-After`` header (seconds) on a 429 or
  503 is honoured when the deadline leaves room for it, and the request gives up at once when it does not.
* **Failures as values.** ``HttpResult.error`` is ``None`` on success, else ``"<reason>: <detail>"``. The
  reason is ``deadline_exceeded`` when time ran out, else what the last attempt met: ``timeout`` (of one
  attempt), ``connection_error``, ``incomplete_read``, ``protocol_error`` or ``http_<status>`` (e.g.
  ``http_503`` after its retries, ``http_401`` at once: retrying cannot change it).

Connections are not reused between requests (one per attempt) and proxy variables are not read: this is
meant for a model server on the local network, where neither matters.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HttpResult", "RequestPolicy", "post_json"]

_RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
_RETRY_AFTER_STATUS = frozenset({429, 503})


@dataclass(frozen=True)
class RequestPolicy:
    """How long one request may take and how it retries.

    Attributes:
        deadline: seconds of wall clock for the whole request, all attempts and waits included.
        attempt_timeout: seconds one attempt may take before it is abandoned and retried; ``None``: an
            attempt may use all the time left (a timed-out attempt then ends the request).
        max_retries: attempts after the first, for the failures listed in the module docstring.
        backoff: seconds before the first retry, doubled for every further one.
        max_backoff: the longest backoff wait (a server's ``Retry-After`` is not capped by it).
    """

    deadline: float = 120.0
    attempt_timeout: float | None = None
    max_retries: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if not self.deadline > 0:
            raise ValueError(f"deadline must be a positive number of seconds, got {self.deadline}")
        if self.attempt_timeout is not None and not self.attempt_timeout > 0:
            raise ValueError(f"attempt_timeout must be positive seconds or None, got {self.attempt_timeout}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"backoff ({self.backoff}) and max_backoff ({self.max_backoff}) must be >= 0")


@dataclass(frozen=True)
class HttpResult:
    """The outcome of one request (after any retries).

    Attributes:
        status: the HTTP status of the last response, ``None`` when no response came.
        body: the response body of a success, or of an HTTP error that is not retried; ``b""`` otherwise.
        error: ``None`` on success (a 2xx response read in full), else ``"<reason>: <detail>"``.
        attempts: how many attempts were made.
        seconds: wall-clock seconds the request took.
    """

    status: int | None
    body: bytes
    error: str | None
    attempts: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.error is None


class _AttemptFailed(Exception):
    """One attempt got no complete response; ``str(self)`` is ``"<kind>: <detail>"``."""


class _Watchdog:
    """Shuts a connection's socket down at a point in time, so that whatever read or write blocks on it
    returns, in any phase of the request.

    It holds a duplicate of the socket's descriptor: ``http.client`` hands the socket from the connection
    to the response (and TLS wraps it) along the way, but ``shutdown`` acts on the socket itself, which the
    duplicate reaches throughout; and while the duplicate is open its number cannot be reused by another
    socket. ``shutdown`` (not ``close``) is what is safe while another thread is blocked on the socket.
    """

    def __init__(self, seconds: float) -> None:
        self._lock, self._socket, self.fired, self._finished = threading.Lock(), None, False, False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if self._socket is not None or self._finished:
                return
            self._socket = sock.dup()
            if self.fired:  # the time ran out while connecting
                self._shutdown()

    def _fire(self) -> None:
        with self._lock:
            if not self._finished:
                self.fired = True
                self._shutdown()

    def _shutdown(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):  # already closed by the peer
                self._socket.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._finished = True
            if self._socket is not None:
                self._socket.close()


def _attempt(
    url: urllib.parse.SplitResult, body: bytes, headers: Mapping[str, str], seconds: float
) -> tuple[int, bytes, http.client.HTTPMessage]:
    """One request, abandoned after ``seconds``; raises ``_AttemptFailed`` without a complete response."""
    connection_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    # The socket timeout bounds each single operation (connect included); the watchdog bounds their sum.
    connection = connection_class(url.hostname, url.port, timeout=seconds)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    watchdog = _Watchdog(seconds)

    def create_connection(*args, **kwargs):
        sock = socket.create_connection(*args, **kwargs)
        watchdog.watch(sock)  # before a TLS handshake, which may block too
        return sock

    connection._create_connection = create_connection  # http.client's hook for making the socket
    try:
        connection.connect()
        watchdog.watch(connection.sock)  # in case the hook above was not used
        connection.request("POST", path, body=body, headers=dict(headers))
        response = connection.getresponse()
        data = response.read()
        if watchdog.fired:  # a body without a length ends at the shutdown, looking complete
            raise _AttemptFailed(f"timeout: no complete response within {seconds:.3g} s")
        return response.status, data, response.headers
    except _AttemptFailed:
        raise
    except http.client.IncompleteRead as error:
        if watchdog.fired:
            raise _AttemptFailed(f"timeout: no complete response within {seconds:.3g} s") from None
        raise _AttemptFailed(
            f"incomplete_read: the body ended after {len(error.partial)} bytes, {error.expected} short"
        ) from None
    except (OSError, http.client.HTTPException) as error:
        if watchdog.fired or isinstance(error, TimeoutError):
            raise _AttemptFailed(f"timeout: no complete response within {seconds:.3g} s") from None
        # OSError: refused, reset, closed before the status line (RemoteDisconnected), unreachable, TLS.
        kind = "connection_error" if isinstance(error, OSError) else "protocol_error"
        raise _AttemptFailed(f"{kind}: {type(error).__name__}: {error}") from None
    finally:
        watchdog.finish()
        connection.close()


def _retry_after_seconds(headers: http.client.HTTPMessage) -> float | None:
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the exponential backoff is used instead


def _http_failure(status: int, data: bytes) -> str:
    detail = data[:300].decode("utf-8", "replace").strip()
    return f"http_{status}: {detail}" if detail else f"http_{status}"


def post_json(
    url: str, payload: object, *, headers: Mapping[str, str] | None = None, policy: RequestPolicy = RequestPolicy()
) -> HttpResult:
    """POSTs ``payload`` as JSON to ``url`` under ``policy``; never raises for network or server failures.

    Raises ``ValueError`` only for a ``url`` that is not ``http(s)://host[:port]/...`` (a caller's mistake).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must look like http://host:port/path or https://..., got {url!r}")
    body = json.dumps(payload).encode("utf-8")
    all_headers = {"Content-Type": "application/json", "Accept": "application/json", **(headers or {})}
    start = time.monotonic()
    deadline_at = start + policy.deadline

    def result(status: int | None, data: bytes, error: str | None, attempts: int) -> HttpResult:
        return HttpResult(status, data, error, attempts, time.monotonic() - start)

    attempts = 0
    while True:
        left = deadline_at - time.monotonic()
        seconds = left if policy.attempt_timeout is None else min(left, policy.attempt_timeout)
        seconds = max(seconds, 1e-3)  # a zero socket timeout would mean non-blocking, not "no time"
        attempts += 1
        retry_after = None
        status = None
        try:
            status, data, response_headers = _attempt(parts, body, all_headers, seconds)
        except _AttemptFailed as error:
            failure = str(error)
        else:
            if 200 <= status < 300:
                return result(status, data, None, attempts)
            failure = _http_failure(status, data)
            if status not in _RETRYABLE_STATUS:
                return result(status, data, failure, attempts)
            if status in _RETRY_AFTER_STATUS:
                retry_after = _retry_after_seconds(response_headers)
        left = deadline_at - time.monotonic()
        if left <= 0:
            return result(
                status,
                b"",
                f"deadline_exceeded: {policy.deadline:.3g} s passed during attempt {attempts}, which met {failure}",
                attempts,
            )
        if attempts > policy.max_retries:
            return result(status, b"", f"{failure} (gave up after {attempts} attempt{'s' * (attempts > 1)})", attempts)
        wait = retry_after if retry_after is not None else min(policy.max_backoff, policy.backoff * 2 ** (attempts - 1))
        if wait >= left:
            source = "the server's Retry-After" if retry_after is not None else "the backoff"
            return result(
                status,
                b"",
                f"deadline_exceeded: {source} of {wait:.3g} s would pass the deadline, "
                f"{left:.3g} s away, after attempt {attempts}, which met {failure}",
                attempts,
            )
        time.sleep(wait)
