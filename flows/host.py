"""One acceptance at a time per engine host: the Prefect concurrency limit that says so, and the
slot a run holds while its engines run. Here, not in flows/service.py, so that the flow and the
service that creates the limit both import it (the flow imported the service, which imports the
flow)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def host_limit() -> str:
    """The Prefect global concurrency limit that lets one acceptance at a time use this host."""
    return f"quantgate-host-{socket.gethostname()}"


@contextlib.contextmanager
def host_slot() -> Iterator[None]:
    """Hold this host's slot while engines run (a no-op where the limit was not created, as in
    a one-shot `quantgate run` on Prefect's ephemeral server: asked first, so that Prefect's
    "Concurrency limits ... do not exist" warning, which a user cannot act on, is not printed)."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(host_limit())
    except ObjectNotFound:
        yield
        return
    with concurrency(host_limit(), occupy=1, strict=False, lease_duration=600):
        yield
