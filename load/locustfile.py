"""Locust user that streams fixed-size /v1/completions and records raw per-request samples.

Runs in its own Locust process (gevent), so it is self-contained: configuration arrives in
QG_* environment variables and samples leave as JSON lines in QG_SAMPLES_FILE.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time

import gevent
from locust import events, task
from locust.contrib.fasthttp import FastHttpUser

MODEL = os.environ.get("QG_MODEL", "")
PROMPT_TOKENS = int(os.environ.get("QG_PROMPT_TOKENS", "128"))
OUTPUT_TOKENS = int(os.environ.get("QG_OUTPUT_TOKENS", "32"))
SEED = int(os.environ.get("QG_SEED", "1234"))
LEVEL = os.environ.get("QG_LEVEL", "")
TIMEOUT_S = float(os.environ.get("QG_TIMEOUT_S", "120"))
# Token ids far from the special tokens at the start of the vocabulary and inside any
# vocabulary the demo models use (SmolLM2 has 49,152), so every id is an ordinary token.
TOKEN_ID_MIN = int(os.environ.get("QG_TOKEN_ID_MIN", "1000"))
TOKEN_ID_MAX = int(os.environ.get("QG_TOKEN_ID_MAX", "40000"))
SAMPLES_FILE = os.environ.get("QG_SAMPLES_FILE", "")
# A pause after a failed request, so a dead server is not hammered in a tight loop.
ERROR_BACKOFF_S = 0.1

_user_numbers = itertools.count()
_write_lock = threading.Lock()


def _write_sample(sample: dict) -> None:
    if not SAMPLES_FILE:
        return
    line = json.dumps(sample) + "\n"
    # One write per line in append mode: lines from several worker processes never interleave.
    with _write_lock, open(SAMPLES_FILE, "a", encoding="utf-8") as handle:
        handle.write(line)


@events.init.add_listener
def _check_config(environment, **_kwargs) -> None:
    # SystemExit passes through Locust's event hooks (exceptions do not): a bad setup stops
    # the run with a non-zero exit code instead of loading the server with nonsense.
    if not MODEL:
        raise SystemExit("quantgate locustfile: QG_MODEL (served model name) is not set")
    if PROMPT_TOKENS < 1 or OUTPUT_TOKENS < 1 or not 0 <= TOKEN_ID_MIN <= TOKEN_ID_MAX:
        raise SystemExit(
            f"quantgate locustfile: bad sizes: QG_PROMPT_TOKENS={PROMPT_TOKENS}, "
            f"QG_OUTPUT_TOKENS={OUTPUT_TOKENS}, token ids {TOKEN_ID_MIN}..{TOKEN_ID_MAX}"
        )


class CompletionsUser(FastHttpUser):
    """One closed-loop client: send a request, read its stream to the end, send the next."""

    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    def on_start(self) -> None:
        # Each user of each level has its own seeded stream of prompts: every stage gets the same
        # prompts, and no prompt repeats within a server's life, so the prefix cache never hits.
        self._rng = random.Random(f"{SEED}:{LEVEL}:{next(_user_numbers)}")

    def _prompt(self) -> list[int]:
        return [self._rng.randint(TOKEN_ID_MIN, TOKEN_ID_MAX) for _ in range(PROMPT_TOKENS)]

    @task
    def stream_completion(self) -> None:
        body = {
            "model": MODEL,
            "prompt": self._prompt(),
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start_s = time.time()
        start = time.perf_counter()
        ttft_ms = None
        gaps_ms: list[float] = []
        chunks = 0
        usage_tokens = None
        error = None
        last = start
        with self.client.post(
            "/v1/completions", json=body, stream=True, catch_response=True, name="/v1/completions"
        ) as resp:
            try:
                with gevent.Timeout(TIMEOUT_S, TimeoutError(f"no complete answer in {TIMEOUT_S}s")):
                    if getattr(resp, "error", None) is not None and not resp.status_code:
                        error = f"{type(resp.error).__name__}: {resp.error}"
                    elif resp.status_code != 200:
                        error = f"HTTP {resp.status_code}: {_body_head(resp)}"
                    else:
                        # Line by line: a sized read would wait for bytes and smear TTFT.
                        raw = resp._response
                        while True:
                            line = raw.readline(b"\n")
                            if not line:
                                break
                            line = line.strip()
                            if not line.startswith(b"data:"):
                                continue
                            data = line[5:].strip()
                            if data == b"[DONE]":
                                raw.read()  # the chunked terminator: frees the connection for reuse
                                break
                            event = json.loads(data)
                            if "error" in event and not event.get("choices"):
                                error = f"stream error: {event['error']}"
                                break
                            if event.get("usage"):
                                usage_tokens = event["usage"].get("completion_tokens")
                            if event.get("choices"):
                                now = time.perf_counter()
                                if ttft_ms is None:
                                    ttft_ms = (now - start) * 1000
                                else:
                                    gaps_ms.append((now - last) * 1000)
                                last = now
                                chunks += 1
                        if error is None and ttft_ms is None:
                            error = "stream ended without a token"
            except Exception as exc:  # every failure becomes a recorded sample, never a crash
                error = f"{type(exc).__name__}: {exc}"
                _discard_connection(resp)
            e2e_ms = (time.perf_counter() - start) * 1000
            output_tokens = usage_tokens if usage_tokens is not None else chunks
            # Locust's own statistics (CSV, HTML) show end-to-end time per request.
            resp.request_meta["response_time"] = e2e_ms
            resp.request_meta["response_length"] = output_tokens
            if error:
                resp.failure(error)
            else:
                resp.success()
        if ttft_ms is not None:
            self.environment.events.request.fire(
                request_type="TTFT",
                name="/v1/completions",
                response_time=ttft_ms,
                response_length=0,
                exception=None,
                context={},
            )
        _write_sample(
            {
                "start_s": start_s,
                "ttft_ms": ttft_ms,
                "e2e_ms": None if error else e2e_ms,
                "output_tokens": output_tokens,
                "itl_ms": gaps_ms,
                "error": error,
            }
        )
        if error:
            gevent.sleep(ERROR_BACKOFF_S)


def _body_head(resp) -> str:
    try:
        return (resp.text or "")[:200].replace("\n", " ")
    except Exception:
        return ""


def _discard_connection(resp) -> None:
    """Close a half-read connection so the pool never hands out a socket mid-stream."""
    raw = getattr(resp, "_response", None)
    pool, sock = getattr(raw, "_pool", None), getattr(raw, "_sock", None)
    if raw is None or sock is None:
        return
    raw._sock = raw._pool = None
    if pool is not None:
        pool.release_socket(sock)
    else:
        sock.close()
