"""Locust user that streams fixed-size /v1/completions and records raw per-request samples.

Runs in its own Locust process (gevent), so it is self-contained: configuration arrives in
QG_* environment variables (load/locust_config.py) and samples leave as JSON lines in
QG_SAMPLES_FILE. In distributed mode the workers send each sample to the master as a Locust
message and only the master writes.

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

import importlib.util
import itertools
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import gevent
import gevent.event
from locust import events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

# Run by path (locust -f), this file's siblings must come from its own checkout, whichever `load`
# the interpreter finds first (none, or another checkout installed in the venv).
_HERE = Path(__file__).resolve().parent
_FOUND = importlib.util.find_spec("load")
if _FOUND is None or _FOUND.origin is None or Path(_FOUND.origin).resolve().parent != _HERE:
    sys.path.insert(0, str(_HERE.parent))

from load.arrivals import Arrivals  # noqa: E402 - once the repository is on the path
from load.locust_config import LocustConfig  # noqa: E402
from load.stream_timing import StreamTimes, read_stream  # noqa: E402

CONFIG = LocustConfig.from_env()
STREAM = f"{CONFIG.prompt_salt}/{CONFIG.level}" if CONFIG.prompt_salt else CONFIG.level
TOKEN_IDS = range(CONFIG.token_id_min, CONFIG.token_id_max + 1)
SAMPLE_MESSAGE = "qg_sample"
# A pause after a failed request, so a dead server is not hammered in a tight loop.
ERROR_BACKOFF_S = 0.1
JSON_HEADERS = {"Content-Type": "application/json"}
# The engine's API key, if it has one: quantgate hands it over in OPENAI_API_KEY (infra/secrets.py).
if os.environ.get("OPENAI_API_KEY"):
    JSON_HEADERS["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"

_user_numbers = itertools.count()
_tickets = itertools.count()
_finished = itertools.count(1)
_write_lock = threading.Lock()
_state: dict = {"environment": None, "arrivals": None, "samples": None,
                "spawned": gevent.event.Event(), "prompts": []}


def _write_line(sample: dict) -> None:
    if not CONFIG.samples_file:
        return
    line = json.dumps(sample) + "\n"
    with _write_lock:
        # One handle for the run, flushed per line: a killed run keeps every sample written.
        if _state["samples"] is None:
            _state["samples"] = open(CONFIG.samples_file, "a", encoding="utf-8")  # noqa: SIM115
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
    c = CONFIG
    if not c.model:
        raise SystemExit("quantgate locustfile: QG_MODEL (served model name) is not set")
    if c.prompt_tokens < 1 or c.output_tokens < 1 or not 0 <= c.token_id_min <= c.token_id_max:
        raise SystemExit(
            f"quantgate locustfile: bad sizes: QG_PROMPT_TOKENS={c.prompt_tokens}, "
            f"QG_OUTPUT_TOKENS={c.output_tokens}, token ids {c.token_id_min}..{c.token_id_max}"
        )
    if c.rate < 0 or c.max_requests < 0:
        raise SystemExit(f"quantgate locustfile: bad QG_RATE={c.rate} or QG_MAX_REQUESTS={c.max_requests}")
    if c.prompts_file:
        with open(c.prompts_file, encoding="utf-8") as lines:
            _state["prompts"] = [json.loads(line) for line in lines if line.strip()]
        if not _state["prompts"]:
            raise SystemExit(f"quantgate locustfile: no prompts in QG_PROMPTS_FILE={c.prompts_file}")
    _state["environment"] = environment
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(SAMPLE_MESSAGE, _on_sample_message)


@events.spawning_complete.add_listener
def _all_users_spawned(user_count: int, **_kwargs) -> None:
    # Closed loop: every user waits for this, so all start together, as the requests of
    # `vllm bench serve --max-concurrency N` do. Users spawned one by one (Locust's -r) would
    # leave the loop staggered for good, a different load from the reference's.
    if CONFIG.rate > 0 and _state["arrivals"] is None:
        _state["arrivals"] = _arrivals(user_count)
    _state["spawned"].set()


def _arrivals(user_count: int) -> Arrivals | None:
    runner = _state["environment"].runner
    if isinstance(runner, MasterRunner):
        return None
    # Each process offers its users' share of the rate; independent Poisson streams add up to
    # one Poisson stream of the full rate at the server.
    mine = runner.user_count if isinstance(runner, WorkerRunner) else user_count
    share = mine / CONFIG.total_users if CONFIG.total_users else 1.0
    if share <= 0:
        return None
    seed = f"{CONFIG.seed}:{CONFIG.level}:arrivals:{runner.worker_index}"
    return Arrivals(CONFIG.rate * share, seed, time.perf_counter(), CONFIG.arrivals_for_s)


@events.test_start.add_listener
def _graceful_end(environment, **_kwargs) -> None:
    # Locust's own --run-time makes a master quit at once: its workers' in-flight requests
    # would finish after the master is gone and their samples would be lost. Stopping first
    # waits until every worker has finished its requests (and sent their samples).
    runner = environment.runner
    if CONFIG.master_run_s > 0 and isinstance(runner, MasterRunner):

        def end() -> None:
            runner.stop()
            runner.quit()

        gevent.spawn_later(CONFIG.master_run_s, end)


def _quit_when_budget_spent() -> None:
    if CONFIG.max_requests and next(_finished) >= CONFIG.max_requests:
        gevent.spawn(_state["environment"].runner.quit)


class CompletionsUser(FastHttpUser):
    """One client: closed loop, or a member of the open-loop pool (see the module docstring)."""

    network_timeout = CONFIG.timeout_s
    connection_timeout = CONFIG.timeout_s

    def on_start(self) -> None:
        # Each user of each level has its own seeded stream of prompts: every stage gets the same
        # prompts (both sides of a paired round too), and no prompt repeats within a server's
        # life, so the prefix cache never hits.
        runner = self.environment.runner
        self._rng = random.Random(f"{CONFIG.seed}:{STREAM}:{runner.worker_index}:{next(_user_numbers)}")
        self._worker = _worker_name(self.environment)

    def _prompt(self) -> list[int]:
        # One call for the whole prompt (randint per token was the client's largest cost, and
        # every user's work delays the other users' reads).
        pool = _state["prompts"]
        if not pool:
            return self._rng.choices(TOKEN_IDS, k=CONFIG.prompt_tokens)
        # A replayed prompt, drawn with replacement (its set's length distribution). One random
        # token after the first makes a repeat miss the prefix cache, as random prompts do.
        ids = pool[self._rng.randrange(len(pool))]
        return ids[:1] + self._rng.choices(TOKEN_IDS) + ids[1:]

    def _wait_for_arrival(self) -> float | None:
        """Wait until every user is spawned; then, open loop only, sleep until this user's next
        scheduled arrival and return its wall-clock time."""
        _state["spawned"].wait()
        if CONFIG.rate <= 0:
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
        if CONFIG.max_requests and next(_tickets) >= CONFIG.max_requests:
            raise StopUser()
        scheduled_s = self._wait_for_arrival()
        sample = self._one_request()
        sample["scheduled_s"] = scheduled_s
        sample["worker"] = self._worker
        _record(sample)
        _quit_when_budget_spent()
        if sample["error"] and CONFIG.rate <= 0:
            gevent.sleep(ERROR_BACKOFF_S)

    def _one_request(self) -> dict:
        # Serialized before the clock starts: the JSON encoding is the client's work, not the
        # server's (vLLM's client encodes inside its clock; this only narrows the gap).
        prompt = self._prompt()
        body = json.dumps({
            "model": CONFIG.model,
            "prompt": prompt,
            "max_tokens": CONFIG.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **CONFIG.request_body,
        }).encode()
        start_s = time.time()
        start = time.perf_counter()
        stream = StreamTimes(start)
        with self.client.post(
            "/v1/completions", data=body, headers=JSON_HEADERS, stream=True, catch_response=True,
            name="/v1/completions",
        ) as resp:
            try:
                timeout_s = CONFIG.timeout_s
                with gevent.Timeout(timeout_s, TimeoutError(f"no complete answer in {timeout_s}s")):
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
