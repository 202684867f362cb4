"""tests/fake_openai.py's server with a /v1/chat/completions route that keeps every request body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fake_openai import FakeOpenAI, _Handler


class FakeChat(FakeOpenAI):
    """Answers every chat request with `answer` (or `answer(body)`); `requests` holds the bodies
    it received."""

    def __init__(self, answer: str | Callable[[dict], str] = "42", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = answer

    @staticmethod
    def handler() -> type:
        return _ChatHandler


class _ChatHandler(_Handler):
    server_state: FakeChat

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            super().do_POST()
            return
        import json

        fake = self.server_state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        with fake._lock:
            fake.requests.append(body)
        self._json(200, {
            "id": "chat-fake", "object": "chat.completion", "model": fake.model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": fake.answer(body)
                                     if callable(fake.answer) else fake.answer}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        })
