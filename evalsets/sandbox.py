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

import ast
import ctypes
import functools
import itertools
import marshal
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

# Shared by both processes: frames (a 4-byte length, then one value). A value is a tag byte and
# its body: N None, T True, F False, i<hex>; int, f<repr>; float, c<float><float> complex,
# s<n>:<n bytes of UTF-8> str, b<n>:<n bytes> bytes, y bytearray, l<n>; list of n values,
# t tuple, S set, z frozenset, d<n>; dict of n key-value pairs, r<n>; a handle: an object left in
# the answer's process. Decoding builds plain data only (nothing received runs) and imports
# nothing: `json` would cost each process milliseconds.
_WIRE = r"""
import builtins, marshal, os, sys

MAX_FRAME = 64 << 20
MAX_DEPTH = 100
SINGLE = {b"N": None, b"T": True, b"F": False}
SIZED = {b"s": str, b"b": bytes, b"y": bytearray}
SEQUENCES = {b"l": list, b"t": tuple, b"S": set, b"z": frozenset, b"d": dict}
TAGS = {kind: tag for tag, kind in [*SIZED.items(), *SEQUENCES.items()]}
BASES = ((int, int.__int__), (float, float.__float__), (str, str.__str__), (complex, complex),
         (list, list), (tuple, tuple), (dict, dict), (set, set), (frozenset, frozenset),
         (bytes, bytes), (bytearray, bytearray))


class Broken(BaseException):
    '''The other process closed the connection, or sent what is not a message.'''


def encode(value, handle):
    '''`value` as bytes: plain data as itself (a subclass of it as its base), anything else as
    the handle number handle(value) gives it.'''
    out = []
    put(value, handle, out, 0)
    return b"".join(out)


def put(value, handle, out, depth):
    kind = type(value)
    if value is None or kind is bool:
        out.append(b"N" if value is None else b"T" if value else b"F")
    elif kind is int:
        out.append(b"i%x;" % value)
    elif kind is float:
        out.append(b"f%r;" % value)
    elif kind is str or kind is bytes or kind is bytearray:
        data = value.encode("utf-8", "surrogatepass") if kind is str else value
        out += [b"%s%d:" % (TAGS[kind], len(data)), bytes(data)]
    elif kind is complex:
        out += [b"c", b"f%r;" % value.real, b"f%r;" % value.imag]
    elif kind in TAGS:
        if depth >= MAX_DEPTH:
            raise ValueError("nested too deeply")
        out.append(b"%s%d;" % (TAGS[kind], len(value)))
        for item in (value if kind is not dict else [part for pair in value.items() for part in pair]):
            put(item, handle, out, depth + 1)
    else:
        for base, plain in BASES:
            if isinstance(value, base):
                return put(plain(value), handle, out, depth)
        out.append(b"r%d;" % handle(value))


def listed(*parts):
    '''A list from values already encoded.'''
    return b"l%d;" % len(parts) + b"".join(parts)


def decode(data, resolve):
    '''The value `data` holds; resolve(n) is what stands for handle n on this side.'''
    value, end = take(data, 0, resolve, 0)
    if end != len(data):
        raise ValueError("bytes after the value")
    return value


def take(data, at, resolve, depth):
    tag, at = data[at:at + 1], at + 1
    if tag in SINGLE:
        return SINGLE[tag], at
    if tag == b"c":
        real, at = take(data, at, resolve, depth)
        imag, at = take(data, at, resolve, depth)
        if type(real) is not float or type(imag) is not float:
            raise ValueError("a complex number of other than floats")
        return complex(real, imag), at
    stop = data.index(b":" if tag in SIZED else b";", at)
    field, at = data[at:stop], stop + 1
    if tag == b"i":
        return int(field, 16), at
    if tag == b"f":
        return float(field), at
    if tag == b"r":
        return resolve(int(field)), at
    size = int(field)
    if size < 0 or size > len(data) - at:
        raise ValueError(f"a size of {size} in a message of {len(data)} bytes")
    if tag in SIZED:
        chunk = data[at:at + size]
        return (chunk.decode("utf-8", "surrogatepass") if tag == b"s" else SIZED[tag](chunk)), at + size
    if tag not in SEQUENCES:
        raise ValueError(f"not a value: tag {tag!r}")
    if depth >= MAX_DEPTH:
        raise ValueError("nested too deeply")
    items = []
    for _ in range(size * 2 if tag == b"d" else size):
        item, at = take(data, at, resolve, depth + 1)
        items.append(item)
    if tag == b"d":
        return dict(zip(items[::2], items[1::2])), at
    return SEQUENCES[tag](items), at


def send(fd, data):
    data = len(data).to_bytes(4, "big") + data
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        raise Broken("closed") from None


def read_exactly(fd, size):
    parts = []
    while size:
        try:
            part = os.read(fd, min(size, 1 << 20))
        except OSError:
            part = b""
        if not part:
            raise Broken("closed")
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def receive(fd, resolve):
    size = int.from_bytes(read_exactly(fd, 4), "big")
    if size > MAX_FRAME:
        raise Broken(f"a message of {size} bytes (at most {MAX_FRAME})")
    try:
        return decode(read_exactly(fd, size), resolve)
    except (ValueError, TypeError, IndexError, KeyError, RecursionError, OverflowError) as exc:
        raise Broken(f"not a message ({type(exc).__name__}: {str(exc)[:100]})") from None


def text(exc):
    try:
        return str(exc)[:300]
    except BaseException:
        return ""


def line(exc, filename, source):
    '''The last line of `filename` the traceback passes through, stripped (as extract_tb).'''
    found, tb = "", exc.__traceback__
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    while tb is not None:
        number = tb.tb_lineno or 0
        if tb.tb_frame.f_code.co_filename == filename and 0 < number <= len(lines):
            found = lines[number - 1].strip()
        tb = tb.tb_next
    return found
"""

# The answer's process: it holds the untrusted code, two pipe ends to the tests' process and
# nothing else (no verdict pipe, no secret, no tests). Its code runs only after the tests' process
# says it is ready (so, without a uid of its own, after that process made itself non-dumpable).
_ANSWER = _WIRE + r"""
MUTABLE = (list, dict, set, bytearray)
OPERATIONS = {
    "call": lambda target, args, kwargs: target(*args, **kwargs),
    "getattr": getattr, "setattr": setattr, "getitem": lambda target, key: target[key],
    "iter": iter, "next": next, "len": len, "bool": bool, "str": str, "repr": repr,
}


def answer(request, response):
    '''Run the answer's code, then serve the tests' requests on its objects until they end.'''
    sources = marshal.loads(sys.stdin.buffer.read())  # from the parent, not from the tests
    objects, numbers = [], {}

    def handle(value):
        number = numbers.get(id(value))
        if number is None:
            number = numbers[id(value)] = len(objects)
            objects.append(value)
        return number

    def held(value):  # as data, else (nested too deeply, a conversion raised) as a handle
        try:
            return encode(value, handle)
        except Exception:
            return b"r%d;" % handle(value)

    receive(request, objects.__getitem__)  # the tests are ready
    scope = {"__name__": "solution", "__builtins__": builtins}
    for stage in ("guard.py", "solution.py"):
        try:
            exec(compile(sources[stage], stage, "exec"), scope)
        except BaseException as exc:
            send(response, encode(["error", stage, type(exc).__name__, text(exc),
                                   line(exc, stage, sources[stage])], handle))
            return 1
    send(response, listed(b"s5:names", listed(*[listed(encode(name, handle), held(value))
                                                 for name, value in list(scope.items())
                                                 if not (name.startswith("__") and name.endswith("__"))])))
    while True:
        operation, target, *args = receive(request, objects.__getitem__)
        try:
            parts = [b"s1:v", held(OPERATIONS[operation](target, *args))]
            if operation == "call":  # what it did to its arguments, for the tests' own copies
                parts.append(held([arg for arg in [*args[0], *args[1].values()] if type(arg) in MUTABLE]))
            reply = listed(*parts)
        except BaseException as exc:
            reply = encode(["e", type(exc).__name__, text(exc)], handle)
        send(response, reply)


status = 0
try:
    status = answer(int(sys.argv[1]), int(sys.argv[2]))
except Broken:
    pass  # the tests are done with it
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(status)
"""

# The tests' process: it runs the tests on the answer's names, reaching the answer's objects only
# through Remote handles, and writes the one report the parent trusts, with the secret.
_JUDGE = _WIRE + r"""
BROKEN = []
MUTABLE = (list, dict, set, bytearray)


class AnswerError(Exception):
    '''An exception the answer raised that has no builtin namesake.'''


class Remote:
    '''An object of the answer's: each use is a request to its process, except equality and
    hashing, which are by identity and decided here: the answer never sees what it is compared
    with.'''

    __slots__ = ("_number",)

    def __init__(self, number):
        object.__setattr__(self, "_number", number)

    def __eq__(self, other):
        return other._number == self._number if type(other) is Remote else NotImplemented

    def __hash__(self):
        return hash((Remote, self._number))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __getattr__(self, name):
        if name == "_number":
            raise AttributeError(name)
        return ask("getattr", self, name)

    def __setattr__(self, name, value):
        ask("setattr", self, name, value)

    def __call__(self, *args, **kwargs):
        return ask("call", self, list(args), kwargs)

    def __getitem__(self, key):
        return ask("getitem", self, key)

    def __iter__(self):
        return ask("iter", self)

    def __next__(self):
        return ask("next", self)

    def __len__(self):
        return ask("len", self)

    def __bool__(self):
        return ask("bool", self)

    def __str__(self):
        return ask("str", self)

    def __repr__(self):
        return ask("repr", self)


def share(value):
    if type(value) is Remote:
        return value._number
    raise TypeError(f"the tests pass the answer a {type(value).__name__}: only plain data and "
                    "the answer's own objects cross to its process")


def answer_error(name, message, iterating):
    '''The builtin exception `name`, else an AnswerError of that name. Only next() may stop an
    iteration: a StopIteration from a call would end a map() or all() of the tests unseen.'''
    kind = getattr(builtins, name, None)
    if name == "StopIteration" and not iterating:
        kind = None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:
            pass
    return type(name if name.isidentifier() else "AnswerError", (AnswerError,), {})(message)


def exchange(request):
    if BROKEN:
        raise Broken(BROKEN[0])
    try:
        send(REQUEST, encode(request, share))
        return receive(RESPONSE, Remote)
    except Broken as exc:
        BROKEN.append(str(exc))
        raise


def is_list(value, length, kinds):
    return type(value) is list and len(value) == length and all(
        type(part) is kind for part, kind in zip(value, kinds))


def write_back(mutable, changed):
    '''What the call did to its list, dict, set or bytearray arguments, done to the tests' own
    (only data, and only what the answer could have done to them in one process).'''
    if type(changed) is not list or len(changed) != len(mutable):
        return
    for old, new in zip(mutable, changed):
        if type(new) is type(old) and old != new:  # unchanged ones keep what they hold
            if type(old) is list or type(old) is bytearray:
                old[:] = new
            else:
                old.clear()
                old.update(new)


def ask(operation, *args):
    reply = exchange([operation, *args])
    if is_list(reply, 2, (str,)) and reply[0] == "v" and operation != "call":
        return reply[1]
    if is_list(reply, 3, (str,)) and reply[0] == "v" and operation == "call":
        write_back([arg for arg in [*args[1], *args[2].values()] if type(arg) in MUTABLE], reply[2])
        return reply[1]
    if is_list(reply, 3, (str, str, str)) and reply[0] == "e":
        raise answer_error(reply[1], reply[2], iterating=operation == "next")
    BROKEN.append("a reply that is not one")
    raise Broken(BROKEN[0])


def judge(tests, guard):
    '''Run the tests on the answer's names; the report: passed, or why not.'''
    if guard:
        exec(compile(guard, "guard.py", "exec"), {"__builtins__": builtins})
    try:
        reply = exchange(["load"])
    except Broken as exc:
        return {"broken": str(exc), "stage": "solution.py"}
    if is_list(reply, 5, (str, str, str, str, str)) and reply[0] == "error":
        stage = reply[1] if reply[1] in ("guard.py", "solution.py") else "solution.py"
        return {"stage": stage, "error": reply[2][:100], "message": reply[3][:300],
                "line": reply[4][:300]}
    if not (is_list(reply, 2, (str, list)) and reply[0] == "names"
            and all(is_list(pair, 2, (str,)) for pair in reply[1])):
        return {"broken": "a reply that is not one", "stage": "solution.py"}
    scope = {"__name__": "solution", "__builtins__": builtins}
    for name, value in reply[1]:
        # The answer's names never replace a builtin the tests use (no `def abs(x): return 0`).
        if name.isidentifier() and not name.startswith("__") and not hasattr(builtins, name):
            scope[name] = value
    try:
        exec(compile(tests, "tests.py", "exec"), scope)
    except BaseException as exc:
        if BROKEN:
            return {"broken": BROKEN[0], "stage": "tests.py"}
        return {"stage": "tests.py", "error": type(exc).__name__, "message": text(exc),
                "line": line(exc, "tests.py", tests)}
    if BROKEN:  # the tests caught it: a pass needs every answer the tests asked for
        return {"broken": BROKEN[0], "stage": "tests.py"}
    return {"passed": True}


verdict, REQUEST, RESPONSE = (int(arg) for arg in sys.argv[1:4])
given = marshal.loads(sys.stdin.buffer.read())
if given["private"]:  # no uid of its own: same-uid code must not trace it or open /proc/<pid>/
    import ctypes
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
report = judge(given["tests"], given["guard"])
report["secret"] = given["secret"]
data = repr(report).encode()  # str and bool values only: ast.literal_eval reads it
while data:
    data = data[os.write(verdict, data):]
os._exit(0)
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
    returncode: int | None  # of the answer's process (negative: the signal that ended it)
    stdout: str  # the answer's output (the tests' own goes elsewhere)
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


ANSWER_GRACE_S = 1.0  # once the tests' process is done: how long the answer's may take to exit
VERDICT_BYTES = 64_000


def _ended(returncode: int | None, cpu_s: int, stderr: str) -> str:
    """Why a process went away before the tests finished, from its exit status (None: it closed
    its end of the connection but had not exited)."""
    if returncode is None:
        return "stopped answering before the tests finished (closed its connection, did not exit)"
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        if -returncode in (signal.SIGXCPU, signal.SIGKILL):
            return f"cpu limit: killed by {name} (limit {cpu_s} s of CPU)"
        return f"killed by {name}"
    if returncode == 0:
        return "exited before the tests finished (exit status 0)"
    last = stderr.strip().splitlines()[-1:] or [""]
    return f"crashed: exit status {returncode} {last[0]}".strip()


@dataclass(frozen=True)
class _Ending:
    """How one run ended, as the parent saw it."""

    timed_out: bool
    report: dict  # the tests' process's report, {} unless it carries the run's secret
    judge_status: int | None
    answer_status: int | None  # None: still running when the parent killed it


def _classify(ending: _Ending, timeout_s: float, cpu_s: int, memory_mb: int, answer_stderr: str,
              judge_stderr: str) -> tuple[bool, str]:
    report = ending.report
    if ending.timed_out:
        return False, f"timeout: no result within {timeout_s:g} s wall clock; process groups killed"
    if ending.judge_status == 0 and report.get("passed") is True:
        return True, "passed"
    if "error" in report:
        error, message, line = report["error"], report.get("message", ""), report.get("line", "")
        if error == "MemoryError":
            return False, f"memory limit: MemoryError under a {memory_mb} MiB address-space limit"
        if error == "AssertionError" and report.get("stage") == "tests.py":
            return False, f"assertion failed: {line or message}".strip()
        detail = f": {message}" if message else ""
        return False, f"error in {report.get('stage', '?')}: {error}{detail}"
    if "broken" in report:
        if report["broken"] != "closed":
            return False, f"broke its connection to the tests: {report['broken']}"
        return False, _ended(ending.answer_status, cpu_s, answer_stderr)
    return False, f"the tests' process: {_ended(ending.judge_status, cpu_s, judge_stderr)}"


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


# A child reads its program from stdin, compiled (length, then marshal): compiling it there
# would cost each process of each run milliseconds. Only this process writes that part.
_BOOT = ("import marshal, sys; "
         "exec(marshal.loads(sys.stdin.buffer.read(int.from_bytes(sys.stdin.buffer.read(4), 'big'))))")
_COMPILE = ("import marshal, sys; "
            "sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), sys.argv[1], 'exec')))")


@functools.cache
def _compiled(interpreter: str, program: str, name: str) -> bytes:
    """`program` compiled by the sandbox's interpreter (marshal is per version), framed for _BOOT."""
    done = subprocess.run([interpreter, "-I", "-S", "-c", _COMPILE, name], input=program.encode(),
                          capture_output=True, timeout=60, check=True)
    return len(done.stdout).to_bytes(4, "big") + done.stdout


def _spawn(layers: Isolation, fds: tuple[int, ...], workdir: Path, stdout: Any, stderr: Any,
           confine: Callable[[], None]) -> subprocess.Popen:
    """One of a run's two processes: `python -I -c _BOOT fd...`, its program and input on stdin."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(workdir),
        "TMPDIR": SANDBOX_DIR if layers.mount_namespace else str(workdir),
    }
    return subprocess.Popen(
        [layers.interpreter, "-I", "-c", _BOOT, *map(str, fds)],
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=stderr,
        pass_fds=fds,
        start_new_session=True,
        preexec_fn=confine,
    )


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


def _collect(judge: subprocess.Popen, answer: subprocess.Popen, judge_input: bytes,
             answer_input: bytes, verdict_r: int, secret: str, timeout_s: float) -> _Ending:
    """Hand both their input, read the verdict (bounded), wait for the tests' process to the
    deadline, give the answer's a moment to exit on its own, then kill both groups."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []

    def read_verdict() -> None:
        with os.fdopen(verdict_r, "rb") as verdict:
            while sum(map(len, chunks)) < VERDICT_BYTES and (chunk := verdict.read(4096)):
                chunks.append(chunk)

    reader = threading.Thread(target=read_verdict, daemon=True)
    reader.start()
    for process, given in ((judge, judge_input), (answer, answer_input)):
        try:
            if process.stdin is not None:
                process.stdin.write(given)
                process.stdin.close()
        except OSError:
            pass  # it died before reading: its exit status tells why
    timed_out = False
    try:
        judge.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    if not timed_out:
        try:
            answer.wait(timeout=max(0.0, min(ANSWER_GRACE_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
    answer_status = answer.returncode
    _kill_group(judge)
    _kill_group(answer)
    reader.join(timeout=KILL_GRACE_S)
    try:
        report = ast.literal_eval(b"".join(chunks)[:VERDICT_BYTES].decode(errors="replace") or "{}")
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        report = {}
    if not isinstance(report, dict) or report.get("secret") != secret:
        report = {}  # not the tests' process's: whatever wrote it is not heard
    return _Ending(timed_out, report, judge.returncode, answer_status)


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
