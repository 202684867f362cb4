"""A server that is already running somewhere: quantgate probes it but never starts or stops it."""

from __future__ import annotations

import ipaddress
import os
import posixpath
import socket
import threading
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import httpx
from pydantic import Field, field_validator

from infra.checkpoint import weight_bytes
from infra.engine import Engine, EngineArgs, EngineFacts, register
from infra.errors import EngineError, SpecError, did_you_mean
from infra.probe import cache_config, get_json, optional_int
from infra.secrets import redact, remember

RESOLVE_TIMEOUT_S = 2.0  # a name that does not resolve by then is compared by its spelling
THIS_HOST = "this host"  # what every address of this machine (loopback, its own, 0.0.0.0) is
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
DEFAULT_PORTS = {"http": 80, "https": 443}
PROBE_TIMEOUT_S = 5.0  # a running server lists its models at once


def _endpoint(url: str) -> tuple[str, int | str, str]:
    """(host, port, path) of an engine URL: the scheme's default port filled in, the path without
    dot segments, repeated or trailing slashes (http://H:80//v1/ is http://h/v1)."""
    parts = urlsplit(url.strip())
    try:
        port: int | str = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 0)
    except ValueError:  # not a number: compared as written
        port = parts.netloc.rpartition(":")[2]
    path = posixpath.normpath("/" + parts.path.lstrip("/"))
    return (parts.hostname or "").rstrip("."), port, path.rstrip("/")


def _resolve(host: str, timeout_s: float) -> set[str] | None:
    """The addresses `host` resolves to, or None when it does not resolve within `timeout_s`
    (getaddrinfo takes no timeout: it runs in a daemon thread nobody waits for past that)."""
    found: list[set[str]] = []

    def lookup() -> None:
        try:
            found.append({info[4][0] for info in socket.getaddrinfo(host, None,
                                                                    type=socket.SOCK_STREAM)})
        except (OSError, UnicodeError):
            pass

    thread = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return found[0] if found else None


def _own_addresses() -> set[str]:
    """This machine's interface addresses (psutil, a dependency of Locust), else its name's."""
    try:
        import psutil

        return {entry.address.split("%")[0] for entries in psutil.net_if_addrs().values()
                for entry in entries if entry.family in (socket.AF_INET, socket.AF_INET6)}
    except (ImportError, OSError):
        return _resolve(socket.gethostname(), RESOLVE_TIMEOUT_S) or set()


def _addresses(host: str, own: set[str], timeout_s: float) -> set[str]:
    """Where `host` leads: IP addresses, THIS_HOST for this machine, or the name itself when it
    cannot be resolved (two names that resolve nowhere are only one server if spelt alike)."""
    if host in LOCAL_NAMES or host.endswith(".localhost"):
        return {THIS_HOST}
    try:
        addresses = {str(ipaddress.ip_address(host.split("%")[0]))}
    except ValueError:
        addresses = _resolve(host, timeout_s) or {host}
    leads = set()
    for address in addresses:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            leads.add(address)
            continue
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        local = ip.is_loopback or ip.is_unspecified or str(ip) in own
        leads.add(THIS_HOST if local else str(ip))
    return leads


def same_server(first: str, second: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> bool:
    """Whether two engine URLs reach one server: same port and path (scheme defaults, slashes
    normalised) on hosts that resolve to a common address, where 127.0.0.0/8, ::1, localhost,
    0.0.0.0 and this machine's own addresses are all this host. Each name resolves within
    `timeout_s`; one that does not is compared by its spelling."""
    (host, port, path), (other_host, other_port, other_path) = _endpoint(first), _endpoint(second)
    if (port, path) != (other_port, other_path):
        return False
    if host == other_host:
        return True
    own = _own_addresses()
    return bool(_addresses(host, own, timeout_s) & _addresses(other_host, own, timeout_s))


def check_running(base_url: str, model: str, timeout_s: float | None = None) -> None:
    """Refuse a base URL that is not an http(s) URL, whose server does not list its models
    within `timeout_s` (default PROBE_TIMEOUT_S), or that does not serve `model`."""
    timeout_s = PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    example = "e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(base_url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port  # raises on a port that is not a number
    except ValueError:
        valid = False
    if not valid:
        raise EngineError(f"--base-url {base_url!r} is not an http(s) URL with a host, {example}")
    try:
        names = [entry["id"] for entry in get_json(base_url.rstrip("/"), "/v1/models",
                                                   timeout_s)["data"]]
    except httpx.TimeoutException as err:
        raise EngineError(f"the server at {base_url} did not list its models within "
                          f"{timeout_s:g} s: check it is an OpenAI-compatible server") from err
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise EngineError(f"no OpenAI-compatible server answers at {base_url} ({reason}): start "
                          f"the stage's server, or give its root as --base-url, {example}") from err
    if model not in names:
        raise EngineError(f"the server at {base_url} serves {names}, not --model {model!r}; "
                          f"{did_you_mean(model, names)}")


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{redact(url)!r} is not an http(s) URL with a host, e.g. "
                         "http://10.0.0.5:8000")
    if parts.password is not None:
        raise ValueError(f"{redact(url)!r} carries a password; give the server's API key through "
                         "engine.api_key_env instead")
    return url


class ExternalEngineSpec(EngineArgs):
    """A server that is already running; quantgate only talks to it."""

    kind: Literal["external"]
    url: str = Field(description="OpenAI-compatible root, e.g. http://10.0.0.5:8000")
    stage_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-stage URL overrides, keyed by stage name."
    )
    model: str | None = Field(default=None, description="Served model name; default: the only one.")
    api_key_env: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable that holds the servers' API key (sent as "
                    "a Bearer token); never the key itself.")

    starts_server: ClassVar[bool] = False
    reports_config: ClassVar[bool] = False  # judged on what it exposes (/metrics)

    check_url = field_validator("url")(_check_url)

    @field_validator("stage_urls")
    @classmethod
    def _check_stage_urls(cls, urls: dict[str, str]) -> dict[str, str]:
        for url in urls.values():
            _check_url(url)
        return urls

    def url_of(self, stage: str) -> str:
        return self.stage_urls.get(stage, self.url)

    def axes_device(self) -> str:
        return "cuda"  # an external server is taken to be a CUDA vLLM

    def cache_identity(self, stage: str, flags: Any) -> dict:
        return {"kind": "external", "url": self.url_of(stage), "model": self.model}

    def api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise SpecError(f"engine.api_key_env: environment variable {self.api_key_env} is not "
                            "set; export it with the servers' API key")
        remember(key)
        return key

    def core_plan(self, usable: Any = None):
        from infra.cores import CorePlan, usable_cores

        cores = tuple(sorted(usable)) if usable is not None else usable_cores()
        # Usually another host; on this one, its cores are its operator's to keep apart.
        return CorePlan(usable=cores, engine=(), client=cores, shared=False,
                        reason="external engine: its cores are not planned here")

    def serves_apart(self, stage: str, other: str) -> bool:
        return self.url_of(stage) != self.url_of(other)

    def check_stages(self, stages: list[tuple[str, str, bool]]) -> None:
        seen = {"baseline"} | {name for name, _, _ in stages}
        for name in self.stage_urls:
            if name not in seen:  # it would fall back to `url`: the baseline's own server
                raise ValueError(f"engine.stage_urls: {name!r} is not a stage; "
                                 f"{did_you_mean(name, tuple(seen))}")
        url = {name: self.url_of(name).rstrip("/") for name in seen}
        for name, parent, serves_parent_again in stages:
            # http://localhost:9001 and http://127.0.0.1:9001/ are one server, too.
            if not serves_parent_again and same_server(url[name], url[parent]):
                also = "" if url[name] == url[parent] else f", which {url[parent]} also reaches"
                raise ValueError(
                    f"engine.stage_urls: stage {name!r} would be served by its parent "
                    f"{parent!r}'s own server ({url[name]}{also}) and compared "
                    f"with itself; give {name!r} its own URL in stage_urls")


@register
class ExternalEngine(Engine):
    kind = "external"
    args = ExternalEngineSpec

    def __init__(self, spec, checkpoint: Path, flags, log_path: Path, stage: str = "") -> None:
        self.spec = spec
        self.checkpoint = checkpoint
        self.base_url = spec.stage_urls.get(stage, spec.url).rstrip("/")

    def start(self) -> EngineFacts:
        try:
            models = get_json(self.base_url, "/v1/models")["data"]
        except (httpx.HTTPError, KeyError, ValueError) as err:
            raise EngineError(f"external engine at {self.base_url} is not answering: {err}") from err
        names = [m["id"] for m in models]
        model = self.spec.model or (names[0] if len(names) == 1 else None)
        if model not in names:
            raise EngineError(
                f"external engine at {self.base_url} serves {names}; set engine.model to one of them"
            )
        try:
            cache = cache_config(httpx.get(f"{self.base_url}/metrics", timeout=10).text)
        except httpx.HTTPError:
            cache = {}
        return EngineFacts(
            base_url=self.base_url,
            model=model,
            command=[f"(external server at {self.base_url})"],
            kv_cache_tokens=optional_int(cache.get("kv_cache_size_tokens")),
            kv_cache_dtype=cache.get("cache_dtype"),
            kv_cache_bytes=optional_int(cache.get("kv_cache_memory_bytes")),
            weight_bytes=weight_bytes(self.checkpoint) if self.checkpoint.is_dir() else None,
            max_model_len=next(m for m in models if m["id"] == model).get("max_model_len"),
        )

    def stop(self) -> None:
        """Not ours to stop."""
