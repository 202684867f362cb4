"""Locust user that streams fixed-size /v1/completions and records raw per-request samples.

Runs in its own Locust process (gevent), so it is self-contained: configuration arrives in
QG_* environment variables and samples leave as JSON lines in QG_SAMPLES_FILE. In distributed
mode the workers send each sample to the master as a Locust message and only the master writes.

Three ways to pace requests:
- closed loop (default): each user sends its next request when the previous one ends; all
  users send their first request together, once Locust has spawned them all;
- closed loop with a request budget (QG_MAX_REQUESTS): the same, and the process quits once
  that many requests have finished (like `vllm bench serve --num-prompts`);
- open loop (QG_RATE > 0): one Poisson arrival schedule per process, fixed in advance from a
  seeded generator; whichever user is free takes the next arrival and sleeps until its time.
  Arrivals do not wait for answers, so the server sees Poisson traffic as long as the pool has
  a free user; when it has none the request leaves late and the lag is recorded per sample.
  (Users that each wait an exponential time *after* their own request are not Poisson at the
  server: their next arrival waits on the previous answer, so a slow server is offered less.)
"""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
import time

import gevent
import gevent.event
from locust import events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

MODEL = os.environ.get("QG_MODEL", "")
PROMPT_TOKENS = int(os.environ.get("QG_PROMPT_TOKENS", "128"))
OUTPUT_TOKENS = int(os.environ.get("QG_OUTPUT_TOKENS", "32"))
SEED = int(os.environ.get("QG_SEED", "1234"))
LEVEL = os.environ.get("QG_LEVEL", "")
# A stage timed against an engine the run kept up gets prompt streams of its own: the kept
# engine has already answered the unsalted ones, and a repeat would hit its prefix cache.
SALT = os.environ.get("QG_PROMPT_SALT", "")
STREAM = f"{SALT}/{LEVEL}" if SALT else LEVEL
TIMEOUT_S = float(os.environ.get("QG_TIMEOUT_S", "120"))
MAX_REQUESTS = int(os.environ.get("QG_MAX_REQUESTS", "0"))
RATE = float(os.environ.get("QG_RATE", "0"))
# Open loop: no arrival is sent later than this many seconds after the first (0: no limit). A
# user that would wait past it stops, rather than sleeping through Locust's stop timeout.
ARRIVALS_FOR_S = float(os.environ.get("QG_ARRIVALS_FOR_S", "0"))
TOTAL_USERS = int(os.environ.get("QG_TOTAL_USERS", "0"))
# Distributed mode: the master ends the run itself after this many seconds (see _graceful_end).
MASTER_RUN_S = float(os.environ.get("QG_MASTER_RUN_S", "0"))
# Token ids far from the special tokens at the start of the vocabulary and inside any
# vocabulary the demo models use (SmolLM2 has 49,152), so every id is an ordinary token.
TOKEN_ID_MIN = int(os.environ.get("QG_TOKEN_ID_MIN", "1000"))
TOKEN_ID_MAX = int(os.environ.get("QG_TOKEN_ID_MAX", "40000"))
TOKEN_IDS = range(TOKEN_ID_MIN, TOKEN_ID_MAX + 1)
SAMPLES_FILE = os.environ.get("QG_SAMPLES_FILE", "")
# Fields every request adds, e.g. a structured_output stage's response_format (guided decoding).
REQUEST_BODY = json.loads(os.environ.get("QG_REQUEST_BODY") or "{}")
# Prompts replayed from a source (load/prompts.py): token ids, one JSON list a line; empty: random.
PROMPTS_FILE = os.environ.get("QG_PROMPTS_FILE", "")
SAMPLE_MESSAGE = "qg_sample"
# A pause after a failed request, so a dead server is not hammered in a tight loop.
ERROR_BACKOFF_S = 0.1
JSON_HEADERS = {"Content-Type": "application/json"}
# The engine's API key, if it has one: quantgate hands it over in OPENAI_API_KEY (infra/secrets.py).
if os.environ.get("OPENAI_API_KEY"):
    JSON_HEADERS["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
# A chunk that carries no token: vLLM's final usage chunk (compact JSON) or one written with
# spaces. Inside a JSON string these quotes would be escaped, so a token's text cannot match.
NO_CHOICES, NO_CHOICES_SPACED = b'"choices":[]', b'"choices": []'

_user_numbers = itertools.count()
_tickets = itertools.count()
_finished = itertools.count(1)
_write_lock = threading.Lock()
_state: dict = {"environment": None, "arrivals": None, "samples": None,
                "spawned": gevent.event.Event(), "prompts": []}


class Arrivals:
    """A Poisson schedule: the k-th call returns the k-th arrival time (perf_counter seconds).

    The first arrival is at `start`, as in `vllm bench serve`, so the measured window (which
    opens the warm-up after the first request) is anchored to the schedule, whatever the rate.
    """

    def __init__(self, rate: float, seed: str, start: float, for_s: float = 0.0) -> None:
        self._rng = random.Random(seed)
        self._rate = rate
        self._next = start
        self._last = start + for_s if for_s > 0 else float("inf")

    def take(self) -> float | None:
        """The next arrival's time; None once the schedule has ended."""
        # No gevent switch in here: takes are atomic among the users of one process.
        due = self._next
        if due > self._last:
            return None
        self._next += self._rng.expovariate(self._rate)
        return due


def _write_line(sample: dict) -> None:
    if not SAMPLES_FILE:
        return
    line = json.dumps(sample) + "\n"
    with _write_lock:
        # One handle for the run, flushed per line: a killed run keeps every sample written.
        if _state["samples"] is None:
            _state["samples"] = open(SAMPLES_FILE, "a", encoding="utf-8")  # noqa: SIM115
        _state["samples"].write(line)
        _state["samples"].flush()


def _record(sample: dict) -> None:
    runner = _state["environment"].runner if _state["environment"] else None
    if isinstance(runner, WorkerRunner):
        # One message per sample, sent before the task ends: it reaches the master ahead of
        # this worker's "stopped"/"quit" message on the same connection, so none is lost.
        runner.send_message(SAMPLE_MESSAGE, sample)
    else:
        _write_line(sample)


def _on_sample_message(environment, msg, **_kwargs) -> None:
    _write_line(msg.data)


def _worker_name(environment) -> str | None:
    runner = environment.runner
    return f"worker-{runner.worker_index}" if isinstance(runner, WorkerRunner) else None


@events.init.add_listener
def _setup(environment, **_kwargs) -> None:
    # SystemExit passes through Locust's event hooks (exceptions do not): a bad setup stops
    # the run with a non-zero exit code instead of loading the server with nonsense.
    if not MODEL:
        raise SystemExit("quantgate locustfile: QG_MODEL (served model name) is not set")
    if PROMPT_TOKENS < 1 or OUTPUT_TOKENS < 1 or not 0 <= TOKEN_ID_MIN <= TOKEN_ID_MAX:
        raise SystemExit(
            f"quantgate locustfile: bad sizes: QG_PROMPT_TOKENS={PROMPT_TOKENS}, "
            f"QG_OUTPUT_TOKENS={OUTPUT_TOKENS}, token ids {TOKEN_ID_MIN}..{TOKEN_ID_MAX}"
        )
    if RATE < 0 or MAX_REQUESTS < 0:
        raise SystemExit(f"quantgate locustfile: bad QG_RATE={RATE} or QG_MAX_REQUESTS={MAX_REQUESTS}")
    if PROMPTS_FILE:
        with open(PROMPTS_FILE, encoding="utf-8") as lines:
            _state["prompts"] = [json.loads(line) for line in lines if line.strip()]
        if not _state["prompts"]:
            raise SystemExit(f"quantgate locustfile: no prompts in QG_PROMPTS_FILE={PROMPTS_FILE}")
    _state["environment"] = environment
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(SAMPLE_MESSAGE, _on_sample_message)


@events.spawning_complete.add_listener
def _all_users_spawned(user_count: int, **_kwargs) -> None:
    # Closed loop: every user waits for this, so all start together, as the requests of
    # `vllm bench serve --max-concurrency N` do. Users spawned one by one (Locust's -r) would
    # leave the loop staggered for good, a different load from the reference's.
    if RATE > 0 and _state["arrivals"] is None:
        _state["arrivals"] = _arrivals(user_count)
    _state["spawned"].set()


def _arrivals(user_count: int) -> Arrivals | None:
    runner = _state["environment"].runner
    if isinstance(runner, MasterRunner):
        return None
    # Each process offers its users' share of the rate; independent Poisson streams add up to
    # one Poisson stream of the full rate at the server.
    mine = runner.user_count if isinstance(runner, WorkerRunner) else user_count
    share = mine / TOTAL_USERS if TOTAL_USERS else 1.0
    if share <= 0:
        return None
    seed = f"{SEED}:{LEVEL}:arrivals:{runner.worker_index}"
    return Arrivals(RATE * share, seed, time.perf_counter(), ARRIVALS_FOR_S)


@events.test_start.add_listener
def _graceful_end(environment, **_kwargs) -> None:
    # Locust's own --run-time makes a master quit at once: its workers' in-flight requests
    # would finish after the master is gone and their samples would be lost. Stopping first
    # waits until every worker has finished its requests (and sent their samples).
    runner = environment.runner
    if MASTER_RUN_S > 0 and isinstance(runner, MasterRunner):

        def end() -> None:
            runner.stop()
            runner.quit()

        gevent.spawn_later(MASTER_RUN_S, end)


def _quit_when_budget_spent() -> None:
    if MAX_REQUESTS and next(_finished) >= MAX_REQUESTS:
        gevent.spawn(_state["environment"].runner.quit)


class CompletionsUser(FastHttpUser):
    """One client: closed loop, or a member of the open-loop pool (see the module docstring)."""

    network_timeout = TIMEOUT_S
    connection_timeout = TIMEOUT_S

    def on_start(self) -> None:
        # Each user of each level has its own seeded stream of prompts: every stage gets the same
        # prompts (both sides of a paired round too), and no prompt repeats within a server's
        # life, so the prefix cache never hits.
        runner = self.environment.runner
        self._rng = random.Random(f"{SEED}:{STREAM}:{runner.worker_index}:{next(_user_numbers)}")
        self._worker = _worker_name(self.environment)

    def _prompt(self) -> list[int]:
        # One call for the whole prompt (randint per token was the client's largest cost, and
        # every user's work delays the other users' reads).
        pool = _state["prompts"]
        if not pool:
            return self._rng.choices(TOKEN_IDS, k=PROMPT_TOKENS)
        # A replayed prompt, drawn with replacement (its set's length distribution). One random
        # token after the first makes a repeat miss the prefix cache, as random prompts do.
        ids = pool[self._rng.randrange(len(pool))]
        return ids[:1] + self._rng.choices(TOKEN_IDS) + ids[1:]

    def _wait_for_arrival(self) -> float | None:
        """Wait until every user is spawned; then, open loop only, sleep until this user's next
        scheduled arrival and return its wall-clock time."""
        _state["spawned"].wait()
        if RATE <= 0:
            return None
        due = _state["arrivals"].take()
        if due is None:
            raise StopUser()
        delay = due - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        return time.time() - (time.perf_counter() - due)

    @task
    def stream_completion(self) -> None:
        if MAX_REQUESTS and next(_tickets) >= MAX_REQUESTS:
            raise StopUser()
        scheduled_s = self._wait_for_arrival()
        sample = self._one_request()
        sample["scheduled_s"] = scheduled_s
        sample["worker"] = self._worker
        _record(sample)
        _quit_when_budget_spent()
        if sample["error"] and RATE <= 0:
            gevent.sleep(ERROR_BACKOFF_S)

    def _one_request(self) -> dict:
        # Serialized before the clock starts: the JSON encoding is the client's work, not the
        # server's (vLLM's client encodes inside its clock; this only narrows the gap).
        prompt = self._prompt()
        body = json.dumps({
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **REQUEST_BODY,
        }).encode()
        start_s = time.time()
        start = time.perf_counter()
        stream = StreamTimes(start)
        with self.client.post(
            "/v1/completions", data=body, headers=JSON_HEADERS, stream=True, catch_response=True,
            name="/v1/completions",
        ) as resp:
            try:
                with gevent.Timeout(TIMEOUT_S, TimeoutError(f"no complete answer in {TIMEOUT_S}s")):
                    if getattr(resp, "error", None) is not None and not resp.status_code:
                        stream.error = f"{type(resp.error).__name__}: {resp.error}"
                    elif resp.status_code != 200:
                        stream.error = f"HTTP {resp.status_code}: {_body_head(resp)}"
                    else:
                        read_stream(resp._response, stream)
                        if stream.done:
                            resp._response.read()  # the chunked terminator: the connection is reused
                        else:  # a half-read connection must never go back to the pool
                            _discard_connection(resp)
            except Exception as exc:  # every failure becomes a recorded sample, never a crash
                stream.error = f"{type(exc).__name__}: {exc}"
                _discard_connection(resp)
            if stream.end is None:
                stream.end = time.perf_counter()
            sample = stream.sample(start_s)
            sample["prompt_tokens"] = len(prompt)
            # Locust's own statistics (CSV, HTML) show end-to-end time per request.
            resp.request_meta["response_time"] = (stream.end - start) * 1000
            resp.request_meta["response_length"] = sample["output_tokens"]
            if sample["error"]:
                resp.failure(sample["error"])
            else:
                resp.success()
        if sample["ttft_ms"] is not None:
            self.environment.events.request.fire(
                request_type="TTFT",
                name="/v1/completions",
                response_time=sample["ttft_ms"],
                response_length=0,
                exception=None,
                context={},
            )
        return sample



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
