"""Hostile model outputs are contained: scored as failures with a reason, the host unharmed."""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from evalsets import sandbox
from evalsets.sandbox import run_untrusted

REPO = Path(__file__).resolve().parents[2]
LIMIT_S = 3.0
MARGIN_S = 10.0  # start-up, the kill and the sweep; a bound proving the kill works, not a speed test

strong = pytest.mark.skipif(
    not sandbox.isolation().network_namespace or not sandbox.isolation().drop_uid,
    reason="needs root with CAP_SYS_ADMIN (network namespace and a dropped uid)",
)


def _leftovers() -> list[int]:
    """Processes of this process's sandbox uids still alive (zombies are dead already); another
    test process's sandboxes (pytest-xdist runs HumanEval's in parallel) have uids of their own."""
    from evalsets.sandbox import UIDS_PER_PROCESS

    first = 200_000 + (os.getpid() % 4000) * UIDS_PER_PROCESS
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        uid = int(status.split("Uid:")[1].split()[0])
        state = status.split("State:")[1].split()[0]
        if first <= uid < first + UIDS_PER_PROCESS and state != "Z":
            alive.append(int(entry.name))
    return alive


def test_correct_code_passes():
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
    result = run_untrusted("def add(a, b):\n    return a + b\n", tests)
    assert result.passed, result
    assert result.reason == "passed"


def test_failing_assert_is_named():
    result = run_untrusted("def add(a, b):\n    return a - b\n", "assert add(2, 3) == 5\n")
    assert not result.passed
    assert result.reason == "assertion failed: assert add(2, 3) == 5"


def test_exiting_early_with_success_status_is_not_a_pass():
    result = run_untrusted("import os\nos._exit(0)\n", "assert False\n")
    assert not result.passed
    assert "exited before the tests finished" in result.reason


def test_solution_may_use_its_own_directory_and_tempfile():
    code = (
        "import tempfile\nwith open('scratch.txt', 'w') as f:\n    f.write('ok')\n"
        "with tempfile.TemporaryFile() as t:\n    t.write(b'x')\n"
        "def read():\n    return open('scratch.txt').read()\n"
    )
    assert run_untrusted(code, "assert read() == 'ok'\n").passed


@strong
@pytest.mark.parametrize("target", ["/tmp", "/var/tmp", "/dev/shm", str(REPO)])
def test_writing_outside_its_directory_is_refused(target):
    path = Path(target) / f"qg_escape_{secrets.token_hex(6)}"
    code = f"def f():\n    return 1\nopen({str(path)!r}, 'w').write('escaped')\n"
    result = run_untrusted(code, "assert f() == 1\n", timeout_s=LIMIT_S)
    assert not result.passed
    # Refused, or (a folder under the private /tmp, as a clone in /tmp is) not even visible.
    refusals = ("PermissionError", "Read-only file system", "FileNotFoundError")
    assert any(word in result.reason for word in refusals), result.reason
    assert not path.exists()


@strong
def test_network_connection_never_reaches_the_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
            "def f():\n    return 1\n"
        )
        result = run_untrusted(code, "assert f() == 1\n", timeout_s=LIMIT_S)
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert not result.passed
    assert "Network is unreachable" in result.reason or "OSError" in result.reason, result.reason


@strong
def test_fork_bomb_is_capped_and_every_process_killed():
    code = (
        "import os\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.setsid()  # leave the process group: the uid sweep must still get it\n"
        "    except OSError:\n"
        "        pass\n"
    )
    start = time.monotonic()
    result = run_untrusted(code, "pass\n", timeout_s=LIMIT_S, max_processes=8)
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert not result.passed
    assert result.reason.startswith(("timeout", "cpu limit")), result.reason
    deadline = time.monotonic() + 5
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers() == []
    assert os.getpid() > 0 and run_untrusted("x = 1\n", "assert x == 1\n").passed  # host goes on


@pytest.mark.parametrize(
    "code",
    ["while True:\n    pass\n", "import time\ntime.sleep(3600)\n"],
    ids=["busy-loop", "sleep"],
)
def test_endless_code_is_killed_at_the_deadline(code):
    start = time.monotonic()
    result = run_untrusted(code, "pass\n", timeout_s=LIMIT_S)
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert not result.passed
    assert result.reason.startswith(("timeout", "cpu limit")), result.reason


def test_huge_allocation_hits_the_memory_limit():
    start = time.monotonic()
    result = run_untrusted("data = bytearray(10 * 1024 ** 3)\n", "pass\n", timeout_s=LIMIT_S, memory_mb=512)
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert not result.passed
    assert result.reason.startswith("memory limit"), result.reason


def test_endless_output_is_bounded():
    result = run_untrusted("while True:\n    print('x' * 1000)\n", "pass\n", timeout_s=LIMIT_S, file_mb=1)
    assert not result.passed
    assert len(result.stdout) <= sandbox.OUTPUT_TAIL


def test_the_temporary_directory_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    run_untrusted("open('left.txt', 'w').write('x')\n", "pass\n")
    assert list(tmp_path.iterdir()) == []


def test_isolation_is_reported():
    result = run_untrusted("x = 1\n", "assert x == 1\n")
    assert result.isolation == sandbox.isolation().describe()
    if os.geteuid() == 0:
        assert "network namespace" in result.isolation and "unprivileged uid" in result.isolation


def test_without_a_network_namespace_the_socket_guard_refuses(monkeypatch):
    weaker = sandbox.Isolation(
        network_namespace=False,
        mount_namespace=False,
        user_namespace=False,
        drop_uid=sandbox.isolation().drop_uid,
        interpreter=sandbox.isolation().interpreter,
    )
    monkeypatch.setattr(sandbox, "isolation", lambda: weaker)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        result = run_untrusted(code, "pass\n", timeout_s=LIMIT_S)
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert not result.passed
    assert "network access is disabled" in result.reason
    assert "socket guard only" in result.isolation


def test_runs_in_parallel_keep_their_order_and_never_share_a_uid():
    code = "import os, time\nprint(os.getuid(), flush=True)\ntime.sleep(0.5)\n"
    jobs = [(code, "assert True\n"), (code, "assert False\n")] * 3
    results = sandbox.run_untrusted_many(jobs, workers=6)
    assert [result.passed for result in results] == [True, False] * 3
    assert all(result.isolation == sandbox.isolation().describe() for result in results)
    if sandbox.isolation().drop_uid:
        assert len({result.stdout for result in results}) == len(jobs)  # all six ran at once


def test_a_uid_a_run_still_holds_is_not_drawn_again(monkeypatch):
    held = sandbox._sandbox_uid()
    try:
        # The counter comes round to the held uid: the next run skips it.
        index = (held - 200_000) % sandbox.UIDS_PER_PROCESS
        monkeypatch.setattr(sandbox, "_run_counter", iter(range(index, index + 10)))
        drawn = sandbox._sandbox_uid()
        sandbox._release_uid(drawn)
        assert drawn != held
    finally:
        sandbox._release_uid(held)


@strong
def test_a_fork_bomb_among_parallel_runs_harms_none_of_the_others():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    jobs = [(bomb, "pass\n")] + [("def f():\n    return 1\n", "assert f() == 1\n")] * 5
    results = sandbox.run_untrusted_many(jobs, workers=6, timeout_s=LIMIT_S, max_processes=8)
    assert not results[0].passed and [result.passed for result in results[1:]] == [True] * 5
    deadline = time.monotonic() + 5
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers() == []


# The tests run in a process of their own and reach the answer over a pipe: what honest answers
# and tests do in one namespace still works across it.


def test_the_answers_classes_and_objects_are_usable_from_the_tests():
    # MBPP 601's shape: the tests build the answer's objects and hand them back to it.
    code = (
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def max_chain_length(pairs, n):\n"
        "    count, end = 0, float('-inf')\n"
        "    for pair in sorted(pairs, key=lambda p: p.b):\n"
        "        if pair.a > end:\n            count, end = count + 1, pair.b\n"
        "    return count\n"
    )
    tests = (
        "assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4) == 3\n"
        "pair = Pair(1, 2)\npair.a = 7\nassert pair.a == 7 and pair == pair and pair != Pair(7, 2)\n"
    )
    assert run_untrusted(code, tests).passed


def test_generators_and_changes_made_in_place_reach_the_tests():
    code = (
        "def squares(n):\n    for i in range(n):\n        yield i * i\n"
        "def sort_in_place(items, seen=None):\n    items.sort()\n    seen['sorted'] = True\n"
    )
    tests = (
        "assert list(squares(4)) == [0, 1, 4, 9] and 4 in squares(3)\n"
        "items, seen = [3, 1, 2], {}\n"
        "assert sort_in_place(items, seen=seen) is None\n"
        "assert items == [1, 2, 3] and seen == {'sorted': True}\n"
    )
    assert run_untrusted(code, tests).passed


def test_values_cross_exactly():
    code = (
        "def values():\n"
        "    return [float('inf'), -0.0, 10 ** 5000, b'\\x00\\xff', 1 + 2j, frozenset({(1, 2)}),\n"
        "            {(1, 'a'): [None, True]}, 'caf\\u00e9', (), set()]\n"
    )
    tests = (
        "import math\nv = values()\n"
        "assert v == [math.inf, 0.0, 10 ** 5000, b'\\x00\\xff', 1 + 2j, frozenset({(1, 2)}),\n"
        "             {(1, 'a'): [None, True]}, 'caf\\u00e9', (), set()]\n"
        "assert math.copysign(1, v[1]) == -1 and type(v[5]) is frozenset and type(v[8]) is tuple\n"
    )
    assert run_untrusted(code, tests).passed


def test_an_exception_of_the_answer_reaches_the_tests_by_its_name():
    code = ("class Unlucky(Exception):\n    pass\n"
            "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    raise Unlucky('13')\n")
    caught = ("try:\n    f(-1)\nexcept ValueError as exc:\n    assert str(exc) == 'negative'\n"
              "else:\n    assert False\n")
    assert run_untrusted(code, caught).passed
    result = run_untrusted(code, "f(13)\n")
    assert result.reason == "error in tests.py: Unlucky: 13"


def test_the_tests_cannot_hand_the_answer_one_of_their_functions():
    result = run_untrusted("def apply(fn, x):\n    return fn(x)\n", "assert apply(len, 'ab') == 2\n")
    assert not result.passed
    assert result.reason.startswith("error in tests.py: TypeError: the tests pass the answer a "
                                    "builtin_function_or_method: only plain data"), result.reason
