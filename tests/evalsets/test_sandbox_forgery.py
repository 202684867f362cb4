"""An answer cannot report its own pass (issue 27): whatever it does inside its process to reach
the harness's token, report or builtins, it scores 0.0, and its process holds neither the tests nor
anything that writes the verdict."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from evalsets import sandbox
from evalsets.sandbox import run_untrusted
from evalsets.scorers import Scorer

ROW = {"entry_point": "add", "tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"}
WRONG = "def add(a, b):\n    return a - b\n"

strong = pytest.mark.skipif(
    not sandbox.isolation().drop_uid,
    reason="needs root: without a uid of its own the answer shares the invoking user's",
)

# Finds 32-hex-digit strings (the shape of the harness's token) and writes the pass report the
# harness would write, once, to every file descriptor the process has.
FORGE = r'''
import json as _json, os as _os


def _is_token(value):
    return (isinstance(value, str) and len(value.strip()) == 32
            and all(c in "0123456789abcdef" for c in value.strip()))


def _forge(tokens):
    for token in sorted({t.strip() for t in tokens})[:1]:
        for fd in (int(name) for name in _os.listdir("/proc/self/fd")):
            try:
                _os.write(fd, _json.dumps({"token": token}).encode())
            except OSError:
                pass


def _frame_tokens(frame):
    found = []
    while frame is not None:
        found += [value for value in list(frame.f_locals.values()) if _is_token(value)]
        frame = frame.f_back
    return found
'''

# The issue's exploit, as written there.
CALLERS_FRAME = (
    "import json, os, sys\n"
    "scope = sys._getframe(1).f_locals\n"
    "scope['report'].write(json.dumps({'token': scope['token']}))\n"
    "scope['report'].flush()\n"
    "os._exit(0)\n"
)
TRACEBACK_FRAMES = FORGE + (
    "try:\n    raise RuntimeError\nexcept RuntimeError as exc:\n"
    "    _forge(_frame_tokens(exc.__traceback__.tb_frame))\n"
    "_os._exit(0)\n"
)
GC_OBJECTS = FORGE + (
    "import gc\n"
    "tokens = []\n"
    "for obj in gc.get_objects():\n"
    "    tokens += [ref for ref in gc.get_referents(obj) if _is_token(ref)]\n"
    "_forge(tokens)\n"
    "_os._exit(0)\n"
)
EVERY_FD = FORGE + "import sys\n_forge(_frame_tokens(sys._getframe()))\n_os._exit(0)\n"
# Needs no token at all: the harness's own exec of the tests becomes a no-op.
BUILTINS = "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\n" + WRONG
# The forged report, the harness's later one sent to /dev/null, its exit status made 0.
SYSTEM_EXIT = FORGE + (
    "import sys\n"
    "_forge(_frame_tokens(sys._getframe()))\n"
    "_null = _os.open('/dev/null', _os.O_WRONLY)\n"
    "for _fd in [int(name) for name in _os.listdir('/proc/self/fd')]:\n"
    "    if _fd > 2 and _fd != _null:\n"
    "        try:\n            _os.dup2(_null, _fd)\n        except OSError:\n            pass\n"
    "_exit = _os._exit\n"
    "_os._exit = lambda status: _exit(0)\n"
    "raise SystemExit(0)\n"
)
SIGKILL = FORGE + (
    "import signal, sys\n"
    "_forge(_frame_tokens(sys._getframe()))\n"
    "_os.kill(_os.getpid(), signal.SIGKILL)\n"
)
SHADOWED_BUILTIN = "def abs(x):\n    return 0\n" + WRONG
EQUALS_EVERYTHING = (
    "class Anything(int):\n"
    "    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n"
    "class Whatever:\n"
    "    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Whatever() if a > 0 else Anything(7)\n"
)


def score(code: str, row: dict = ROW) -> float:
    return TypeAdapter(Scorer).validate_python({"kind": "code"}).score(f"```python\n{code}```", row)


@pytest.mark.parametrize("code", [
    CALLERS_FRAME, TRACEBACK_FRAMES, GC_OBJECTS, EVERY_FD, BUILTINS, SYSTEM_EXIT, SIGKILL,
], ids=["callers-frame", "traceback-frames", "gc-objects", "every-fd", "builtins-exec",
        "system-exit", "sigkill"])
def test_an_answer_that_writes_its_own_pass_report_scores_0(code):
    assert score(code) == 0.0


def test_the_issues_exploit_fails_for_want_of_a_token_not_by_chance():
    result = run_untrusted(CALLERS_FRAME, ROW["tests"])
    assert not result.passed
    assert result.reason == "error in solution.py: KeyError: 'report'"  # no harness frame above it


def test_a_name_of_the_answer_never_replaces_a_builtin_the_tests_use():
    row = {"entry_point": "add", "tests": "assert abs(add(2, 3) - 5) < 1e-9\n"}
    assert score(SHADOWED_BUILTIN, row) == 0.0
    assert score(WRONG.replace("a - b", "a + b") + "def abs(x):\n    return 0\n", row) == 1.0


def test_an_answer_whose_results_equal_everything_scores_0():
    assert score(EQUALS_EVERYTHING) == 0.0  # a subclass of int crosses as its value: 7, not 'equal'


def test_a_forged_reply_or_verdict_on_every_fd_is_not_heard():
    # New-style forgeries: a well-framed reply, and the report the tests' process writes, sent
    # down every descriptor the answer has; then a wrong answer.
    code = (
        "import os\n"
        "for fd in [int(name) for name in os.listdir('/proc/self/fd')]:\n"
        "    for data in (b'\\x00\\x00\\x00\\x08l2;s1:vT', repr({'passed': True}).encode()):\n"
        "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"
    ) + WRONG
    result = run_untrusted(code, ROW["tests"])
    assert not result.passed
    assert result.reason.startswith("broke its connection to the tests"), result.reason


def test_tests_that_catch_everything_still_fail_when_the_answer_leaves():
    code = "import os\ndef add(a, b):\n    os._exit(0)\n"
    tests = "try:\n    add(2, 3)\nexcept BaseException:\n    pass\n"
    result = run_untrusted(code, tests)
    assert not result.passed
    assert result.reason == "exited before the tests finished (exit status 0)"


def test_the_tests_are_nowhere_in_the_answers_process():
    # Only the tests hold the marker: the answer finds it in no file, frame or object of its
    # process (it builds the marker after looking, so its own source does not count).
    code = (
        "def _seen():\n"
        "    import gc, os, sys\n"
        "    texts = [ref for obj in gc.get_objects() for ref in gc.get_referents(obj)"
        " if type(ref) is str]\n"
        "    frame = sys._getframe(1)\n"
        "    while frame is not None:\n"
        "        texts += [value for value in frame.f_locals.values() if type(value) is str]\n"
        "        frame = frame.f_back\n"
        "    texts += [open(name).read() for name in os.listdir('.') if os.path.isfile(name)]\n"
        "    marker = 'QG_EXPECTED_' + str(4242)\n"
        "    return any(marker in text for text in texts)\n"
        "import os\n"
        "print('seen' if _seen() else 'unseen', sorted(os.listdir('.')))\n"
        "def answer():\n    return 0\n"
    )
    result = run_untrusted(code, "QG_EXPECTED_4242 = 1\nassert answer() == QG_EXPECTED_4242\n")
    assert not result.passed
    assert result.stdout == "unseen []\n", result.stdout


@strong
def test_the_answer_can_open_no_descriptor_or_memory_of_another_process():
    # The judge and this process hold the verdict pipe; with uids of their own the answer can
    # open none of their /proc entries, so a forged verdict never gets there.
    code = (
        "import os\n"
        "mine = {str(os.getpid())}\n"
        "opened = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit() and p not in mine]:\n"
        "    paths = ['/proc/%s/mem' % pid]\n"
        "    try:\n"
        "        paths += ['/proc/%s/fd/%s' % (pid, fd) for fd in os.listdir('/proc/%s/fd' % pid)]\n"
        "    except OSError:\n        pass\n"
        "    for path in paths:\n"
        "        try:\n            fd = os.open(path, os.O_WRONLY)\n"
        "        except OSError:\n            continue\n"
        "        opened.append(path)\n"
        "        os.close(fd)\n"
        "print('opened', len(opened), opened[:3])\n"
    ) + WRONG
    result = run_untrusted(code, ROW["tests"])
    assert not result.passed
    assert result.stdout.startswith("opened 0 []"), result.stdout


def test_a_stop_iteration_from_a_call_cannot_end_the_tests_iteration_unseen():
    # In one process `all(map(f, xs))` is True when f raises StopIteration: map looks empty.
    code = "def add(a, b):\n    raise StopIteration\n"
    assert score(code, {"entry_point": "add", "tests": "assert all(map(add, [2], [3]))\n"}) == 0.0
    iterated = "def pairs():\n    return iter([(2, 3)])\n"
    assert run_untrusted(iterated, "assert [a + b for a, b in pairs()] == [5]\n").passed
