"""Run untrusted model-written Python with its unit tests, contained, and say whether it passed.

Each run gets a throwaway directory (deleted after) and a fresh `python -I` process in its own
session, limited by rlimits (CPU seconds, address space, processes, file size, open files) and a
wall-clock timeout that kills the whole process group. As root (how quantgate runs) it also gets:

- its own network namespace: no interface but a downed loopback, so nothing is reachable;
- its own mount namespace: `/` read-only, empty root-owned tmpfs over the world-writable
  directories (/tmp, /var/tmp, /dev/shm, /run/lock), its work directory at /tmp/sandbox;
- its own unprivileged uid (no passwd entry, fresh for each run), so RLIMIT_NPROC caps a fork
  bomb and every process it left behind, even one that left the process group, is killed
  afterwards with kill(-1) issued as that uid; / is not writable to it anyway.

Where a layer is not available (not root, no CAP_SYS_ADMIN) it is replaced by a weaker one and
`SandboxResult.isolation` says which: e.g. a socket guard inside Python instead of a network
namespace. The probe that decides runs once per process.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SANDBOX_DIR = "/tmp/sandbox"  # where the work directory appears inside the mount namespace
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
OUTPUT_TAIL = 2000
KILL_GRACE_S = 2.0

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18



@functools.cache
def _libc() -> ctypes.CDLL:
    """Resolved in the parent: the child between fork and exec only makes syscalls."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc

# Read by the harness before any untrusted code runs; only a run that reaches the end of the
# tests prints the token, so `os._exit(0)` in the solution cannot pass for a success.
_HARNESS = r"""
import json, os, sys, traceback
def _run():
    token = sys.stdin.readline().strip()
    report = os.fdopen(int(sys.argv[1]), "w")
    scope = {"__name__": "solution", "__builtins__": __builtins__}
    for stage in ("guard.py", "solution.py", "tests.py"):
        try:
            with open(stage) as source:
                exec(compile(source.read(), stage, "exec"), scope)
        except BaseException as exc:
            lines = [f.line for f in traceback.extract_tb(exc.__traceback__) if f.filename == stage]
            report.write(json.dumps({"stage": stage, "error": type(exc).__name__,
                                     "message": str(exc)[:300], "line": (lines or [""])[-1]}))
            report.flush()
            os._exit(1)
    report.write(json.dumps({"token": token}))
    report.flush()
    os._exit(0)
_run()
"""

# Used only where no network namespace can be made: weaker (ctypes or a subprocess get around it).
_SOCKET_GUARD = """\
import socket as _qg_socket
def _qg_no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")
_qg_socket.socket = _qg_socket.create_connection = _qg_socket.socketpair = _qg_no_network
del _qg_socket, _qg_no_network
"""


@dataclass(frozen=True)
class Isolation:
    """The confinement layers one sandbox run gets, beyond rlimits and the timeout."""

    network_namespace: bool
    mount_namespace: bool
    user_namespace: bool
    drop_uid: bool  # run as a fresh unprivileged uid (needs root); else as the invoking user
    interpreter: str

    def describe(self) -> str:
        parts = [
            "network namespace" if self.network_namespace else "socket guard only (no network namespace)",
            "read-only / and private /tmp" if self.mount_namespace else "host filesystem",
            "fresh unprivileged uid" if self.drop_uid else f"runs as uid {os.geteuid()} (not dropped)",
        ]
        return "; ".join(parts)


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one piece of untrusted code."""

    passed: bool
    reason: str  # 'passed', or why not: 'assertion failed: ...', 'timeout: ...', 'memory limit: ...'
    duration_s: float
    returncode: int | None
    stdout: str
    stderr: str
    isolation: str


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _encode(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    result = _libc().mount(_encode(source), _encode(target), _encode(fstype), flags, _encode(data))
    _check(result, f"mount {target}")


def _private_filesystem() -> None:
    """In a fresh mount namespace: nothing propagates to the host, / is read-only, the
    world-writable directories are empty root-owned tmpfs, the cwd is bound at /tmp/sandbox."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    for path in _world_writable():
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=755")
    os.mkdir(SANDBOX_DIR, 0o755)
    _mount(".", SANDBOX_DIR, None, _MS_BIND, None)  # "." is the work directory (Popen's cwd)
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY, None)
    os.chdir(SANDBOX_DIR)


@functools.cache
def _world_writable() -> tuple[str, ...]:
    found = []
    for path in WORLD_WRITABLE:
        real = os.path.realpath(path)
        if os.path.isdir(real) and os.stat(real).st_mode & 0o002 and real not in found:
            found.append(real)
    return tuple(found)


def _limits_and_confinement(
    isolation: Isolation,
    uid: int,
    cpu_s: int,
    memory_mb: int,
    max_processes: int,
    file_mb: int,
    open_files: int,
) -> Callable[[], None]:
    """The preexec_fn: runs in the child after fork (new session already made), before exec."""
    _world_writable()  # both computed here, in the parent
    _libc()

    def confine() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))
        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
        flags = 0
        if isolation.user_namespace:
            flags |= _CLONE_NEWUSER
        if isolation.network_namespace:
            flags |= _CLONE_NEWNET
        if isolation.mount_namespace:
            flags |= _CLONE_NEWNS
        if flags:
            _check(_libc().unshare(flags), "unshare")
        if isolation.mount_namespace:
            _private_filesystem()
        if isolation.drop_uid:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return confine


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


_KILL_ALL = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass  # gone meanwhile
    return pids


def _kill_all_as(uid: int, interpreter: str) -> None:
    """kill(-1, SIGKILL) as `uid` reaches every process of that uid, wherever it moved to
    (a child that called setsid() is out of the process group, not out of the uid)."""
    if not _processes_of(uid):
        return

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    subprocess.run(
        [interpreter, "-I", "-S", "-c", _KILL_ALL],
        preexec_fn=drop,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )


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


def _classify(
    returncode: int | None,
    timed_out: bool,
    report: dict,
    token: str,
    timeout_s: float,
    cpu_s: int,
    memory_mb: int,
    stderr: str,
) -> tuple[bool, str]:
    if timed_out:
        return False, f"timeout: no result within {timeout_s:g} s wall clock; process group killed"
    if returncode == 0 and report.get("token") == token:
        return True, "passed"
    if "error" in report:
        error, message, line = report["error"], report.get("message", ""), report.get("line", "")
        if error == "MemoryError":
            return False, f"memory limit: MemoryError under a {memory_mb} MiB address-space limit"
        if error == "AssertionError" and report.get("stage") == "tests.py":
            return False, f"assertion failed: {line or message}".strip()
        detail = f": {message}" if message else ""
        return False, f"error in {report.get('stage', '?')}: {error}{detail}"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        if -returncode in (signal.SIGXCPU, signal.SIGKILL):
            return False, f"cpu limit: killed by {name} (limit {cpu_s} s of CPU)"
        return False, f"killed by {name}"
    if returncode == 0:
        return False, "exited before the tests finished (exit status 0)"
    last = stderr.strip().splitlines()[-1:] or [""]
    return False, f"crashed: exit status {returncode} {last[0]}".strip()




def run_untrusted(
    code: str,
    tests: str,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    max_processes: int = 8,
    file_mb: int = 16,
    open_files: int = 64,
) -> SandboxResult:
    """Run `code`, then `tests` (plain asserts) in the same namespace, contained; passed means
    every test ran to the end without an exception. `timeout_s` is the wall-clock limit and,
    rounded up, the CPU-seconds limit of each process."""
    layers = isolation()
    cpu_s = max(1, math.ceil(timeout_s))
    uid = _sandbox_uid()
    base = Path(tempfile.mkdtemp(prefix="qg-sandbox-"))  # root-owned 0700: only work/ is theirs
    try:
        workdir = _prepare(base, code, tests, layers, uid)
        token = secrets.token_hex(16)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(workdir),
            "TMPDIR": SANDBOX_DIR if layers.mount_namespace else str(workdir),
        }
        confine = _limits_and_confinement(layers, uid, cpu_s, memory_mb, max_processes, file_mb, open_files)
        report_r, report_w = os.pipe()
        start = time.monotonic()
        # Output goes to files (bounded by RLIMIT_FSIZE), never to pipes that could fill memory.
        with (base / "stdout").open("wb") as out, (base / "stderr").open("wb") as err:
            try:
                process = subprocess.Popen(
                    [layers.interpreter, "-I", "-c", _HARNESS, str(report_w)],
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    pass_fds=(report_w,),
                    start_new_session=True,
                    preexec_fn=confine,
                )
            finally:
                os.close(report_w)
            timed_out, report_raw = _collect(process, token, report_r, timeout_s)
        duration = time.monotonic() - start
        if layers.drop_uid:
            _kill_all_as(uid, layers.interpreter)
        try:
            report = json.loads(report_raw.decode(errors="replace") or "{}")
        except ValueError:
            report = {}
        stderr = _tail(base / "stderr")
        passed, reason = _classify(
            process.returncode,
            timed_out,
            report if isinstance(report, dict) else {},
            token,
            timeout_s,
            cpu_s,
            memory_mb,
            stderr,
        )
        return SandboxResult(
            passed=passed,
            reason=reason,
            duration_s=duration,
            returncode=process.returncode,
            stdout=_tail(base / "stdout"),
            stderr=stderr,
            isolation=layers.describe(),
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        _release_uid(uid)


def run_untrusted_many(jobs: Sequence[tuple[str, str]], workers: int | None = None,
                       **limits: Any) -> list[SandboxResult]:
    """`run_untrusted` for many (code, tests) pairs, `workers` at a time (default: one per CPU
    this process may use, at most 16); results in the order of `jobs`. Each run is as contained
    as a lone one: its own process, limits, namespaces and uid.

    Threads only wait on their processes. The child's preexec_fn runs between fork and exec
    and makes only syscalls, through their wrappers (setrlimit, unshare, mount, setuid), so a
    lock another thread held at the fork cannot stall it; the isolation probe runs once, before
    the threads start."""
    if not jobs:
        return []
    isolation()
    workers = workers or min(16, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)),
                            thread_name_prefix="qg-sandbox") as pool:
        return list(pool.map(lambda job: run_untrusted(*job, **limits), jobs))


def _prepare(base: Path, code: str, tests: str, layers: Isolation, uid: int) -> Path:
    workdir = base / "work"
    workdir.mkdir()
    (workdir / "guard.py").write_text("" if layers.network_namespace else _SOCKET_GUARD)
    (workdir / "solution.py").write_text(code)
    (workdir / "tests.py").write_text(tests)
    if layers.drop_uid:
        base.chmod(0o711)  # the uid may pass through to work/, not list or read the rest
        for path in (workdir, *workdir.iterdir()):
            os.chown(path, uid, uid)
        workdir.chmod(0o700)
    return workdir


def _collect(process: subprocess.Popen, token: str, report_r: int, timeout_s: float) -> tuple[bool, bytes]:
    """Hand over the token, read the report (bounded), wait to the deadline, then kill."""
    chunks: list[bytes] = []

    def read_report() -> None:
        with os.fdopen(report_r, "rb") as report:
            while len(b"".join(chunks)) < 64_000 and (chunk := report.read(4096)):
                chunks.append(chunk)

    reader = threading.Thread(target=read_report, daemon=True)
    reader.start()
    try:
        if process.stdin is not None:
            process.stdin.write(token.encode() + b"\n")
            process.stdin.close()
    except OSError:
        pass  # it died before reading: the exit status tells why
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(process)
    reader.join(timeout=KILL_GRACE_S)
    return timed_out, b"".join(chunks)[:64_000]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
