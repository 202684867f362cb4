"""The timings of one streamed /v1/completions answer, as `vllm bench serve` takes them: TTFT,
the inter-token gaps and the end (TPOT follows from them). Standard library only: the locustfile
imports this module in Locust's own process."""

from __future__ import annotations

import json
import time

# A chunk that carries no token: vLLM's final usage chunk (compact JSON) or one written with
# spaces. Inside a JSON string these quotes would be escaped, so a token's text cannot match.
NO_CHOICES, NO_CHOICES_SPACED = b'"choices":[]', b'"choices": []'


class StreamTimes:
    """Timestamps of one SSE stream, taken as each line leaves the socket buffer.

    Definitions as in `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py): the
    clock starts before the request is sent; a token is a chunk with non-empty `choices`;
    TTFT ends at the first one, inter-token gaps run between consecutive ones; the token count
    is the final usage chunk's completion_tokens (chunks counted when the server sends none).
    The end is the [DONE] line, which vLLM sends right after the last token and the usage.
    """

    __slots__ = ("start", "first", "last", "end", "gaps_ms", "chunks", "usage_tokens", "error",
                 "done")

    def __init__(self, start: float) -> None:
        self.start = start
        self.first: float | None = None
        self.last = start
        self.end: float | None = None
        self.gaps_ms: list[float] = []
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.error: str | None = None
        self.done = False

    def token(self, now: float) -> None:
        if self.first is None:
            self.first = now
        else:
            self.gaps_ms.append((now - self.last) * 1000)
        self.last = now
        self.chunks += 1

    def sample(self, start_s: float) -> dict:
        ttft_ms = None if self.first is None else (self.first - self.start) * 1000
        e2e_ms = (self.end - self.start) * 1000
        return {
            "start_s": start_s,
            "end_s": start_s + e2e_ms / 1000,
            "ttft_ms": ttft_ms,
            "e2e_ms": None if self.error else e2e_ms,
            "output_tokens": self.usage_tokens if self.usage_tokens is not None else self.chunks,
            "itl_ms": self.gaps_ms,
            "error": self.error,
        }


def read_stream(raw, times: StreamTimes) -> None:
    """Read an SSE body into `times` as it arrives: each receive's complete lines at once, all
    stamped with the time that receive returned.

    A sized read would wait for bytes and smear TTFT; a line at a time (the HTTP library's
    readline copies and trims its buffer per line) stamped the later lines of one receive with
    the client's own parsing time, and kept the other users waiting. Token chunks are only
    recognised, never parsed: JSON is decoded for the few lines that are not tokens.
    """
    clock = time.perf_counter
    body = raw._body_buffer  # what geventhttpclient's parser has de-chunked so far
    now = clock()  # the headers' receive may have brought the first lines along
    partial = b""
    while True:
        if body:
            data = partial + bytes(body)
            del body[:]
            *lines, partial = data.split(b"\n")
            for line in lines:  # events and the blank lines between them
                if line[:5] == b"data:" and _data_line(line, now, times):
                    return
        if raw.message_complete or raw._sock is None:
            break
        received = raw._sock.recv(raw.block_size)
        now = clock()
        if not received:  # the server closed the connection
            break
        raw.feed(received)
    if times.first is None:
        times.error = "stream ended without a token"
    elif not times.done:
        # An engine that dies mid-answer: a cut stream is a failure, not a short answer.
        times.error = f"stream cut after {times.chunks} tokens (no [DONE])"


def _data_line(line: bytes, now: float, times: StreamTimes) -> bool:
    """One SSE data line into `times`; True when the stream is over ([DONE] or an error event)."""
    data = line[5:].strip()
    if (data[:1] == b"{" and b'"choices":' in data and NO_CHOICES not in data
            and NO_CHOICES_SPACED not in data):
        times.token(now)
        return False
    if data == b"[DONE]":
        times.end = now
        times.done = True
        return True
    event = json.loads(data)
    if event.get("usage"):
        times.usage_tokens = event["usage"].get("completion_tokens")
    if event.get("choices"):  # a token chunk written some other way
        times.token(now)
    elif "error" in event or event.get("object") == "error":
        times.error = f"stream error: {event.get('error', event)}"
        times.end = now
        return True
    return False
