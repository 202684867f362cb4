"""Run untrusted model-written Python with its unit tests, contained, and say whether it passed.

Each run is two processes, never one: the answer's, which runs the untrusted code and nothing
else, and the tests' (the judge), which runs the tests and alone reports the verdict. The tests
reach the answer only over a pipe: the answer's top-level names come across as plain data
(numbers, strings, containers of them) or, for anything else (functions, classes, modules,
instances), as handles whose calls and attribute reads are requests the answer's process serves.
What it sends back is parsed as tagged JSON data, never pickle or eval, so nothing it sends runs
in the judge; a handle compares equal only to itself, so an answer never sees what it is compared
with (an object whose `__eq__` says yes fails); its names never replace a builtin the tests use.
Whatever the answer's code does to its own process (read its frames, `gc`, /proc/self/fd or
/proc/self/mem, patch builtins or the server loop, `os._exit(0)`, kill itself) it can only change
the replies: the verdict is written by the judge on a pipe the answer's process never holds,
with a secret the answer's process never holds (the parent trusts a report only with it), and
only after the judge ran the tests to the end without the connection breaking.

Both processes get a throwaway directory (deleted after) and a fresh `python -I` in its own
session, limited by rlimits (CPU seconds, address space, processes, file size, open files) and a
wall-clock timeout that kills both process groups. As root (how quantgate runs) each also gets:

- its own network namespace: no interface but a downed loopback, so nothing is reachable;
- its own mount namespace: `/` read-only, empty root-owned tmpfs over the world-writable
  directories (/tmp, /var/tmp, /dev/shm, /run/lock), its work directory at /tmp/sandbox;
- its own unprivileged uid (no passwd entry, fresh for each process of each run), so RLIMIT_NPROC
  caps a fork bomb and every process it left behind, even one that left the process group, is
  killed afterwards with kill(-1) issued as that uid; / is not writable to it anyway. The two
  uids differ, so the answer can neither signal, trace nor open /proc/<pid>/ of the judge or of
  this process.

Where a layer is not available (not root, no CAP_SYS_ADMIN) it is replaced by a weaker one and
`SandboxResult.isolation` says which: e.g. a socket guard inside Python instead of a network
namespace. Without a uid of its own the answer runs as the invoking user: the judge then makes
itself non-dumpable before the answer's code starts (no ptrace or /proc/<pid>/ access for that
uid), and a forged report on this process's pipe lacks the secret; but the invoking process is
then only as safe as the kernel's ptrace policy (Yama ptrace_scope 0 lets same-uid code trace it).
The probe that decides runs once per process.
"""

from __future__ import annotations

import functools
import itertools
import marshal
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsets.sandbox_isolation import Isolation, _kill_all_as, _limits_and_confinement
from evalsets.sandbox_programs import _ANSWER, _JUDGE, _SOCKET_GUARD, _compiled
from evalsets.sandbox_protocol import _classify, _collect, _kill_group, _spawn

OUTPUT_TAIL = 2000


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one piece of untrusted code."""

    passed: bool
    reason: str  # 'passed', or why not: 'assertion failed: ...', 'timeout: ...', 'memory limit: ...'
    duration_s: float
    returncode: int | None  # of the answer's process (negative: the signal that ended it)
    stdout: str  # the answer's output (the tests' own goes elsewhere)
    stderr: str
    isolation: str


UIDS_PER_PROCESS = 200
_run_counter = itertools.count()
_uids_lock = threading.Lock()
_uids_in_use: set[int] = set()


def _sandbox_uid() -> int:
    """A uid no account uses, fresh for each run: its processes (zombies of an earlier run
    included, which would count against RLIMIT_NPROC) are exactly this run's to kill. Never one
    a run still going holds: runs go in parallel (`run_untrusted_many`), and a slow one must not
    be killed by, or count against, a later run that drew its uid. Give it back with
    `_release_uid`."""
    with _uids_lock:
        for _ in range(UIDS_PER_PROCESS):
            uid = 200_000 + (os.getpid() % 4000) * UIDS_PER_PROCESS + next(_run_counter) % UIDS_PER_PROCESS
            if uid not in _uids_in_use:
                _uids_in_use.add(uid)
                return uid
    raise RuntimeError(f"all {UIDS_PER_PROCESS} sandbox uids of this process are in use; "
                       "run fewer sandboxes at once")


def _release_uid(uid: int) -> None:
    with _uids_lock:
        _uids_in_use.discard(uid)


def _interpreters() -> list[str]:
    """Candidate interpreters: the sandbox uid must be able to reach one (a pyenv Python under
    /root is not), so the system's own python3 is a fallback. QG_SANDBOX_PYTHON overrides."""
    override = os.environ.get("QG_SANDBOX_PYTHON")
    if override:
        return [override]
    candidates = [getattr(sys, "_base_executable", sys.executable), sys.executable]
    candidates += [found for name in ("python3", "python3.11") if (found := shutil.which(name))]
    candidates += ["/usr/bin/python3"]
    return list(dict.fromkeys(os.path.realpath(c) for c in candidates if c and os.path.exists(c)))


def _layers() -> list[tuple[bool, bool, bool, bool]]:
    """(network ns, mount ns, user ns, drop uid), strongest first."""
    if os.geteuid() == 0:
        return [(True, True, False, True), (True, False, False, True), (False, False, False, True)]
    return [(True, False, True, False), (False, False, False, False)]


_PROBE = (
    "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
    "except OSError:\n    pass\n"
)


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation that actually works here, found by running a probe in each."""
    for netns, mountns, userns, drop in _layers():
        for interpreter in _interpreters():
            uid = _sandbox_uid()
            candidate = Isolation(netns, mountns, userns, drop, interpreter)
            workdir = tempfile.mkdtemp(prefix="qg-sandbox-probe-")
            try:
                if drop:
                    os.chown(workdir, uid, uid)
                probe = subprocess.run(
                    [interpreter, "-I", "-c", _PROBE],
                    cwd=workdir,
                    preexec_fn=_limits_and_confinement(candidate, uid, 10, 512, 8, 1, 64),
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
                if probe.returncode == 0:
                    return candidate
            except (OSError, subprocess.SubprocessError):
                pass
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                _release_uid(uid)
    return Isolation(False, False, False, False, sys.executable)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-OUTPUT_TAIL:].decode(errors="replace")


def run_untrusted(
    code: str,
    tests: str,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 8,
    file_mb: int = 16,
    open_files: int = 64,
) -> SandboxResult:
    """Run `code` in one process and `tests` (plain asserts, on the answer's top-level names) in
    another, both contained; passed means the tests' process ran every test to the end without
    an exception (the module docstring says why nothing else can report a pass). `timeout_s`
    is the wall-clock limit and, rounded up, the CPU-seconds limit of each process. stdout and
    stderr are the answer's."""
    layers = isolation()
    cpu_s = max(1, math.ceil(timeout_s))
    confine = functools.partial(_limits_and_confinement, layers, cpu_s=cpu_s, memory_mb=memory_mb,
                                max_processes=max_processes, file_mb=file_mb, open_files=open_files)
    uids = [_sandbox_uid()]
    base = Path(tempfile.mkdtemp(prefix="qg-sandbox-"))  # root-owned 0700: only its folders are theirs
    try:
        uids.append(_sandbox_uid())
        answer_uid, judge_uid = uids
        answer_dir = _workdir(base, "answer", layers, answer_uid)
        judge_dir = _workdir(base, "judge", layers, judge_uid)
        secret = secrets.token_hex(16)
        guard = "" if layers.network_namespace else _SOCKET_GUARD
        # marshal's format 4 for plain data is read alike by every Python 3 since 3.4.
        answer_input = _compiled(layers.interpreter, _ANSWER, "<answer>") + marshal.dumps(
            {"guard.py": guard, "solution.py": code}, 4)
        judge_input = _compiled(layers.interpreter, _JUDGE, "<tests>") + marshal.dumps(
            {"tests": tests, "guard": guard, "secret": secret, "private": not layers.drop_uid}, 4)
        start = time.monotonic()
        # Output goes to files (bounded by RLIMIT_FSIZE), never to pipes that could fill memory.
        with (base / "stdout").open("wb") as out, (base / "stderr").open("wb") as err, \
                (base / "judge.log").open("wb") as judge_log:
            verdict_r, verdict_w = os.pipe()
            request_r, request_w = os.pipe()
            response_r, response_w = os.pipe()
            processes: list[subprocess.Popen] = []
            try:
                # The answer's process never holds the verdict pipe: it is closed here before
                # the answer's process is forked.
                processes.append(_spawn(layers, (verdict_w, request_w, response_r), judge_dir,
                                        judge_log, judge_log, confine(judge_uid)))
                for fd in (verdict_w, request_w, response_r):
                    os.close(fd)
                verdict_w = request_w = response_r = -1
                processes.append(_spawn(layers, (request_r, response_w), answer_dir, out, err,
                                        confine(answer_uid)))
            except BaseException:
                for process in processes:
                    _kill_group(process)
                os.close(verdict_r)
                raise
            finally:
                for fd in (verdict_w, request_w, response_r, request_r, response_w):
                    if fd >= 0:
                        os.close(fd)
            judge, answer = processes
            ending = _collect(judge, answer, judge_input, answer_input, verdict_r, secret, timeout_s)
        duration = time.monotonic() - start
        if layers.drop_uid:
            for uid in uids:
                _kill_all_as(uid, layers.interpreter)
        stderr = _tail(base / "stderr")
        passed, reason = _classify(ending, timeout_s, cpu_s, memory_mb, stderr, _tail(base / "judge.log"))
        return SandboxResult(
            passed=passed,
            reason=reason,
            duration_s=duration,
            returncode=answer.returncode,
            stdout=_tail(base / "stdout"),
            stderr=stderr,
            isolation=layers.describe(),
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        for uid in uids:
            _release_uid(uid)


def run_untrusted_many(jobs: Sequence[tuple[str, str]], workers: int | None = None,
                       **limits: Any) -> list[SandboxResult]:
    """`run_untrusted` for many (code, tests) pairs, `workers` at a time (default: one per CPU
    this process may use, at most 16); results in the order of `jobs`. Each run is as contained
    as a lone one: its own two processes, limits, namespaces and uids.

    Threads only wait on their processes. The child's preexec_fn runs between fork and exec
    and makes only syscalls, through their wrappers (setrlimit, unshare, mount, setuid), so a
    lock another thread held at the fork cannot stall it; the isolation probe runs once, before
    the threads start."""
    if not jobs:
        return []
    interpreter = isolation().interpreter
    _compiled(interpreter, _ANSWER, "<answer>")
    _compiled(interpreter, _JUDGE, "<tests>")
    workers = workers or min(16, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)),
                            thread_name_prefix="qg-sandbox") as pool:
        return list(pool.map(lambda job: run_untrusted(*job, **limits), jobs))


def _workdir(base: Path, name: str, layers: Isolation, uid: int) -> Path:
    """An empty directory for one process of the run, its uid's alone: the answer's code never
    reaches the tests (they come on the judge's stdin) nor the judge's directory."""
    workdir = base / name
    workdir.mkdir()
    if layers.drop_uid:
        base.chmod(0o711)  # the uids may pass through to their folders, not list or read the rest
        os.chown(workdir, uid, uid)
        workdir.chmod(0o700)
    return workdir
