"""Overhead benchmark: the latency quantgate's Locust adds on its own, against a server that answers at once.

    python -m tools.benchmarks.overhead [--concurrency 1,4] [--requests 300] [--rounds 2]
    python -m tools.benchmarks.overhead --first-token-ms 5 --token-ms 1   # paced like an engine

A zero-delay OpenAI-compatible server (its own process, asyncio, pre-encoded chunks, TCP_NODELAY)
answers every /v1/completions stream as soon as it has read the request, and notes on its own
clock when it read it and when it wrote the first and last token. Per request, a client's
TTFT minus the server's (first token written - request read) is what the client added: its
send path, the loopback, its receive path and its bookkeeping. The same for TPOT is its
per-token cost. Two clients take turns (ABBA) on the same server: the product's Locust path
(load.runner.run_level, the real Locust subprocess) and a minimal reference client (asyncio
sockets, one substring test per line, no JSON), whose figures are the floor this machine sets:
what a shared box's scheduler adds shows in both.

Printed per concurrency level: p50 / p99 added TTFT and TPOT of each client. Goal: Locust's
added TTFT and TPOT <= 1 ms at p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from load.profile import LoadProfile
from load.runner import run_level

GOAL_MS = 1.0
MODEL = "zero-delay"


# ---------------------------------------------------------------- the zero-delay server


def _event(payload: dict) -> bytes:
    data = b"data: " + json.dumps(payload, separators=(", ", ": ")).encode() + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _stream_chunks(tokens: int) -> list[bytes]:
    """Every write of one streamed answer, encoded once: one per token, usage, [DONE], end."""
    def chunk(choices: list, usage: dict | None = None) -> bytes:
        return _event({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL,
                       "choices": choices, "usage": usage})

    writes = [chunk([{"index": 0, "text": " tok", "finish_reason": None}])
              for _ in range(tokens - 1)]
    writes.append(chunk([{"index": 0, "text": " tok", "finish_reason": "length"}]))
    writes.append(chunk([], {"prompt_tokens": 0, "completion_tokens": tokens,
                             "total_tokens": tokens}))
    done = b"data: [DONE]\n\n"
    writes.append(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
    return writes


STREAM_HEADERS = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")


# Per answered request, the server's own clock (unix seconds): request read, first token
# written, last token written, tokens. GET /timings hands them over and starts a new list.
_timings: list[tuple[float, float, float, int]] = []


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            first_delay_s: float = 0.0, token_delay_s: float = 0.0) -> None:
    cache: dict[int, list[bytes]] = {}
    clock = time.time
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length) if length else b""
            received = clock()
            if head.startswith(b"POST /v1/completions"):
                tokens = int(json.loads(body).get("max_tokens", 16))
                writes = cache.get(tokens) or cache.setdefault(tokens, _stream_chunks(tokens))
                if not token_delay_s and not first_delay_s:
                    # The whole answer in one send: the server spends next to nothing per request,
                    # so with several clients a request does not queue behind others' chunks.
                    first = last = clock()
                    writer.writelines([STREAM_HEADERS, *writes])
                else:
                    writer.write(STREAM_HEADERS)  # at once, as an engine's HTTP layer does
                    if first_delay_s:
                        await asyncio.sleep(first_delay_s)
                    first = last = 0.0
                    for index, data in enumerate(writes):  # one send per token, as an engine does
                        if token_delay_s and 0 < index < tokens:
                            await asyncio.sleep(token_delay_s)
                        if index < tokens:
                            last = clock()
                            first = first or last
                        writer.write(data)
                await writer.drain()
                _timings.append((received, first, last, tokens))
            elif head.startswith(b"GET /timings"):
                data = json.dumps(_timings).encode()
                _timings.clear()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
            else:
                data = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int, first_delay_s: float, token_delay_s: float) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_connection(reader, writer, first_delay_s, token_delay_s)

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    print(f"serving on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


class ZeroDelayServer:
    """The zero-delay server in its own process (so neither client shares its interpreter).

    With delays it paces the stream like an engine, so the clients also pay their wake-ups.
    """

    def __init__(self, first_delay_ms: float = 0.0, token_delay_ms: float = 0.0) -> None:
        self.delays = [str(first_delay_ms), str(token_delay_ms)]

    def __enter__(self) -> ZeroDelayServer:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tools.benchmarks.overhead", "--serve", *self.delays],
            stdout=subprocess.PIPE, text=True,
        )
        line = self._process.stdout.readline()  # the one line it prints; nothing after
        if not line.startswith("serving on "):
            self._process.kill()
            raise RuntimeError(f"zero-delay server did not start: {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[-1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


# ---------------------------------------------------------------- the reference client

# One request as a client saw it: start (unix seconds), TTFT (ms), TPOT (ms).
Seen = tuple[float, float, float]


async def _reference_user(host: str, port: int, body: dict, count: int, seed: int,
                          out: list[Seen]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    rng = random.Random(seed)
    try:
        for _ in range(count):
            prompt = [rng.randint(1000, 40000) for _ in range(len(body["prompt"]))]
            payload = json.dumps(body | {"prompt": prompt}).encode()
            request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: "
                       + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            start_s = time.time()
            start = time.perf_counter()
            writer.write(request)
            first = last = 0.0
            tokens = 0
            while True:
                line = await reader.readline()
                now = time.perf_counter()
                if line.startswith(b"data: [DONE]"):
                    await reader.readuntil(b"0\r\n\r\n")
                    break
                if line.startswith(b"data: {") and b'"choices": []' not in line:
                    last = now
                    first = first or now
                    tokens += 1
            out.append((start_s, (first - start) * 1000, (last - first) * 1000 / (tokens - 1)))
    finally:
        writer.close()


def reference_client(base_url: str, users: int, requests: int, prompt_tokens: int,
                     output_tokens: int) -> list[Seen]:
    """`requests` requests from `users` closed-loop asyncio users, in one process."""
    host, port = base_url.removeprefix("http://").split(":")
    body = {"model": MODEL, "prompt": [0] * prompt_tokens, "max_tokens": output_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    out: list[Seen] = []

    async def run() -> None:
        share = [requests // users + (i < requests % users) for i in range(users)]
        await asyncio.gather(*(_reference_user(host, int(port), body, n, i, out)
                               for i, n in enumerate(share)))

    asyncio.run(run())
    return out


# ---------------------------------------------------------------- the Locust side


def locust_client(base_url: str, users: int, requests: int, prompt_tokens: int,
                  output_tokens: int, out: Path) -> list[Seen]:
    """The product's own Locust path (load.runner.run_level, a real Locust subprocess)."""
    profile = LoadProfile(low_users=users, high_users=users, prompt_tokens=prompt_tokens,
                          output_tokens=output_tokens, requests=requests, warmup_requests=0,
                          request_timeout_s=30)
    samples = run_level(base_url, MODEL, profile, f"c{users}", users, out)
    failed = [s.error for s in samples if s.error]
    if failed:
        raise RuntimeError(f"{len(failed)} Locust requests failed, e.g. {failed[0]}")
    return [(s.start_s, s.ttft_ms, s.tpot_ms) for s in samples]


# ---------------------------------------------------------------- added latency


def server_timings(base_url: str) -> list[list[float]]:
    """What the server saw since the last call: (received, first, last, tokens) per request."""
    with urllib.request.urlopen(base_url + "/timings", timeout=10) as answer:
        return json.loads(answer.read())


def added_latency(seen: list[Seen], served: list[list[float]], warmup: int) -> dict[str, list[float]]:
    """Per request, what the client read above what the server spent: TTFT and TPOT (ms).

    Requests are paired in start order (client start, server receipt); a client sends one
    request per connection at a time, so the orders agree up to near-simultaneous sends, whose
    added latencies are alike anyway. The first `warmup` requests are left out.
    """
    if len(seen) != len(served):
        raise RuntimeError(f"the client saw {len(seen)} requests, the server {len(served)}")
    pairs = list(zip(sorted(seen), sorted(served), strict=True))[warmup:]
    return {
        "ttft": [ttft - (first - received) * 1000 for (_, ttft, _), (received, first, _, _) in pairs],
        "tpot": [tpot - (last - first) * 1000 / (tokens - 1)
                 for (_, _, tpot), (_, first, last, tokens) in pairs],
    }


def percentiles(values: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99)


def measure(users: list[int], requests: int, rounds: int, prompt_tokens: int, output_tokens: int,
            out: Path, delays_ms: tuple[float, float] = (0.0, 0.0)) -> list[dict]:
    rows = []
    with ZeroDelayServer(*delays_ms) as server:
        # One untimed pass, so the server's first connection and request are not measured.
        reference_client(server.base_url, 1, 5, prompt_tokens, output_tokens)
        server_timings(server.base_url)
        for concurrency in users:
            warmup = 2 * concurrency
            added: dict[str, dict[str, list[float]]] = {
                side: {"ttft": [], "tpot": []} for side in ("reference", "locust")}
            order = [side for r in range(rounds)
                     for side in (("reference", "locust") if r % 2 == 0 else ("locust", "reference"))]
            for index, side in enumerate(order):
                if side == "reference":
                    seen = reference_client(server.base_url, concurrency, requests + warmup,
                                            prompt_tokens, output_tokens)
                else:
                    seen = locust_client(server.base_url, concurrency, requests + warmup,
                                         prompt_tokens, output_tokens,
                                         out / f"c{concurrency}-run{index + 1}")
                for metric, values in added_latency(seen, server_timings(server.base_url),
                                                    warmup).items():
                    added[side][metric].extend(values)
            row: dict = {"concurrency": concurrency,
                         "requests_per_side": len(added["locust"]["ttft"])}
            for metric in ("ttft", "tpot"):
                ref, ours = percentiles(added["reference"][metric]), percentiles(added["locust"][metric])
                row[metric] = {"reference_p50_ms": ref[0], "reference_p99_ms": ref[1],
                               "locust_p50_ms": ours[0], "locust_p99_ms": ours[1]}
            row["within_goal"] = all(row[m][f"locust_{p}_ms"] <= GOAL_MS
                                     for m in ("ttft", "tpot") for p in ("p50", "p99"))
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print("\nAdded latency: what each client read above the server's own time (ms)")
    print(f"{'conc':>4} {'metric':>6} {'locust p50':>10} {'locust p99':>10} "
          f"{'reference p50':>13} {'reference p99':>13}")
    for row in rows:
        for metric in ("ttft", "tpot"):
            f = row[metric]
            print(f"{row['concurrency']:>4} {metric.upper():>6} {f['locust_p50_ms']:>10.3f} "
                  f"{f['locust_p99_ms']:>10.3f} {f['reference_p50_ms']:>13.3f} "
                  f"{f['reference_p99_ms']:>13.3f}")
        print(f"{row['concurrency']:>4} {'':>6} {row['requests_per_side']} requests per client: "
              f"{'within' if row['within_goal'] else 'MISSES'} the {GOAL_MS:g} ms goal")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4", help="Comma-separated, e.g. 1,4")
    parser.add_argument("--requests", type=int, default=300, help="Measured requests per run.")
    parser.add_argument("--rounds", type=int, default=2, help="Runs per client, in ABBA order.")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, help="Where Locust's files go (default: a temp dir).")
    parser.add_argument("--first-token-ms", type=float, default=0.0,
                        help="Server delay before the first token (0: answer at once).")
    parser.add_argument("--token-ms", type=float, default=0.0,
                        help="Server delay between tokens (0: stream them at once).")
    parser.add_argument("--serve", nargs=2, type=float, metavar=("FIRST_MS", "TOKEN_MS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(_serve(0, args.serve[0] / 1000, args.serve[1] / 1000))
        return 0
    users = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="qg-overhead-") as scratch:
        out = args.out or Path(scratch)
        rows = measure(users, args.requests, args.rounds, args.prompt_tokens, args.output_tokens,
                       out, (args.first_token_ms, args.token_ms))
        (out / "overhead.json").write_text(json.dumps(rows, indent=1))
    print_table(rows)
    return 0 if all(row["within_goal"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
