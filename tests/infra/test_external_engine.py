"""Two engine URLs that reach the same server are one server, however they are spelt."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from infra import external_engine
from infra.external_engine import same_server


@pytest.fixture
def names(monkeypatch):
    """A resolver that knows only the names a test gives it (no DNS is asked)."""
    known: dict[str, list[str]] = {}

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in known:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (ip, 0)) for ip in known[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(external_engine, "_own_addresses", lambda: {"192.0.2.7", "fd00::7"})
    return known


@pytest.mark.parametrize(("first", "second"), [
    ("http://127.0.0.1:9001", "http://localhost:9001"),
    ("http://localhost:9001/", "http://LOCALHOST:9001"),
    ("http://127.0.0.2:9001", "http://[::1]:9001"),
    ("http://0.0.0.0:9001", "http://127.0.0.1:9001"),
    ("http://[::ffff:127.0.0.1]:9001", "http://localhost:9001"),
    ("http://192.0.2.7:9001", "http://localhost:9001"),  # this host's own address
    ("http://[fd00::7]:9001", "http://127.0.0.1:9001"),
    ("http://engine-a.internal:8000", "http://10.0.0.5:8000"),  # a name and its address
    ("http://engine-a.internal:8000", "http://engine-b.internal:8000//"),  # two names, one box
    ("http://10.0.0.5", "http://10.0.0.5:80"),
    ("https://10.0.0.5", "http://10.0.0.5:443/"),
    ("http://10.0.0.5:8000/gw/a/", "http://10.0.0.5:8000//gw/x/../a"),
])
def test_urls_that_reach_one_server_are_one_server(names, first, second):
    names.update({"engine-a.internal": ["10.0.0.5"], "engine-b.internal": ["10.0.0.9", "10.0.0.5"]})
    assert same_server(first, second) and same_server(second, first)


@pytest.mark.parametrize(("first", "second"), [
    ("http://127.0.0.1:9001", "http://localhost:9002"),
    ("http://10.0.0.5:8000", "http://10.0.0.6:8000"),
    ("http://engine-a.internal:8000", "http://engine-c.internal:8000"),
    ("http://a:1", "http://b:1"),  # resolve nowhere: different spellings, different servers
    ("http://10.0.0.5:8000/gw/a", "http://10.0.0.5:8000/gw/b"),  # a gateway routing by path
    ("http://192.0.2.8:9001", "http://localhost:9001"),
])
def test_urls_that_reach_different_servers_are_different(names, first, second):
    names.update({"engine-a.internal": ["10.0.0.5"], "engine-c.internal": ["10.0.0.6"]})
    assert not same_server(first, second) and not same_server(second, first)


def test_this_hosts_own_addresses_are_read_from_the_machine():
    own = external_engine._own_addresses()
    assert "127.0.0.1" in own or "::1" in own


def test_a_resolver_that_hangs_is_bounded(monkeypatch):
    released = threading.Event()

    def hanging(*args, **kwargs):
        released.wait(30)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    started = time.monotonic()
    try:
        assert not same_server("http://slow-a.internal:8000", "http://slow-b.internal:8000",
                               timeout_s=0.2)
        assert same_server("http://slow-a.internal:8000", "http://slow-a.internal:8000/")
    finally:
        released.set()
    assert time.monotonic() - started < 5
