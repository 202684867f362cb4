"""A tiny OpenAI-compatible streaming server for plumbing tests (stdlib only, runs in a thread)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeOpenAI:
    """Serves /health, /v1/models and streaming or plain /v1/completions with fixed timing.

    Every `token_delay_s` one token chunk is sent; `error_fraction` of the completion requests
    (spread evenly, deterministically) answer HTTP 500 instead. `compact_json` writes chunks as
    vLLM does (no spaces: `"choices":[]`); `token_text` is the text of every token chunk.
    A stream may also end early after `end_after_tokens` tokens: with an error event
    (`end_with="error"`, as vLLM reports a failure mid-stream) or with the connection cut
    (`end_with="cut"`, an engine that died). `split_events` sends each event in two writes, a
    pause between them, so that a client receives lines in pieces. `port`: 0 for a free one.
    """

    def __init__(
        self,
        model: str = "fake-model",
        token_delay_s: float = 0.002,
        first_token_delay_s: float = 0.0,
        error_fraction: float = 0.0,
        include_usage: bool = True,
        compact_json: bool = False,
        token_text: str = " tok",
        end_after_tokens: int | None = None,
        end_with: str = "cut",
        split_events: bool = False,
        port: int = 0,
    ) -> None:
        self.model = model
        self.port = port
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.error_fraction = error_fraction
        self.include_usage = include_usage
        self.compact_json = compact_json
        self.token_text = token_text
        self.end_after_tokens = end_after_tokens
        self.end_with = end_with
        self.split_events = split_events
        self.requests: list[dict[str, Any]] = []
        self.errors_sent = 0
        self._lock = threading.Lock()
        self._error_credit = 0.0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def handler() -> type:
        """The request handler class; a subclass of the fake may answer more routes."""
        return _Handler

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(self.handler()):
            server_state = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _should_fail(self, body: dict[str, Any]) -> bool:
        with self._lock:
            self.requests.append(body)
            self._error_credit += self.error_fraction
            if self._error_credit >= 1.0:
                self._error_credit -= 1.0
                self.errors_sent += 1
                return True
            return False


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn (vLLM) sets it: with Nagle a token chunk waits for the client's
    # delayed ACK, which moves TTFT by tens of ms and bunches the tokens after it.
    disable_nagle_algorithm = True
    server_state: FakeOpenAI

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        fake = self.server_state
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        fake = self.server_state
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if fake._should_fail(body):
            self._json(500, {"error": {"message": "injected failure", "type": "InternalError"}})
            return
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        max_tokens = int(body.get("max_tokens", 16))
        if not body.get("stream"):
            time.sleep(fake.first_token_delay_s + fake.token_delay_s * max_tokens)
            self._json(200, _completion(fake.model, " tok" * max_tokens, prompt_tokens, max_tokens))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        time.sleep(fake.first_token_delay_s)
        for index in range(max_tokens):
            if index == fake.end_after_tokens:
                if fake.end_with == "error":
                    self._event({"error": {"message": "injected mid-stream failure"}})
                    self._end_stream()
                else:  # no [DONE], no chunked terminator: the engine is gone
                    self.close_connection = True
                return
            time.sleep(fake.token_delay_s)
            finish = "length" if index == max_tokens - 1 else None
            chunk = _chunk(fake.model, [{"index": 0, "text": fake.token_text, "finish_reason": finish}])
            self._event(chunk)
        usage = body.get("stream_options", {}).get("include_usage")
        if fake.include_usage and usage:
            self._event(_chunk(fake.model, [], _usage(prompt_tokens, max_tokens)))
        self._end_stream()

    def _end_stream(self) -> None:
        """[DONE], then the chunked body's terminator."""
        self._send(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _event(self, payload: dict[str, Any]) -> None:
        separators = (",", ":") if self.server_state.compact_json else None
        self._send(b"data: " + json.dumps(payload, separators=separators).encode() + b"\n\n")

    def _send(self, data: bytes) -> None:
        if self.server_state.split_events:  # two HTTP chunks, the line broken between them
            half = len(data) // 2
            for piece in (data[:half], data[half:]):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                self.wfile.flush()
                time.sleep(0.003)
            return
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chunk(model: str, choices: list, usage: dict | None = None) -> dict[str, Any]:
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def _completion(model: str, text: str, prompt_tokens: int, tokens: int) -> dict[str, Any]:
    payload = _chunk(model, [{"index": 0, "text": text, "finish_reason": "length"}])
    payload["usage"] = _usage(prompt_tokens, tokens)
    return payload
