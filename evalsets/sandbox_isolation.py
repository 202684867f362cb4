"""The sandbox's isolation layers, applied in each child between fork and exec: rlimits, network
and mount namespaces, a read-only / with a private /tmp, the drop to a fresh uid, and killing
whatever that uid left behind (evalsets/sandbox.py says what each gives, and finds which work here)."""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SANDBOX_DIR = "/tmp/sandbox"  # where the work directory appears inside the mount namespace
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

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
