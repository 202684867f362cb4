"""The receiver of MLflow's signed `model_version.created` webhook: verify, then hand the version on.

MLflow 3.17 signs as mlflow/webhooks/delivery.py `_send_webhook_request` does: the body is
`{"entity", "action", "timestamp", "data"}`; the headers carry X-MLflow-Delivery-Id (a uuid4),
X-MLflow-Timestamp (unix seconds) and X-MLflow-Signature `v1,<base64 HMAC-SHA256>` of
`{delivery_id}.{timestamp}.{body}` under the webhook's secret. It sends each event once (urllib3
retries 429/5xx with the same headers): polling the registry stays the source of truth.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from infra.errors import QuantgateError

log = logging.getLogger(__name__)

# mlflow/webhooks/constants.py (not imported: importing mlflow costs a second and a half).
SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"
SIGNATURE_VERSION = "v1"
VERSION_CREATED = "model_version.created"


class WebhookRejected(QuantgateError):
    """A delivery that is not a fresh, authentic MLflow event; `status_code` is the answer."""

    def __init__(self, reason: str, status_code: int = 401):
        super().__init__(reason)
        self.status_code = status_code


class WebhookIgnored(WebhookRejected):
    """An authentic event of a kind this receiver does not act on."""

    def __init__(self, reason: str):
        super().__init__(reason, status_code=200)


class SeenDeliveries:
    """Delivery ids accepted within the freshness window; older ones are refused as stale anyway.

    Bounded by count too; with `path`, kept in a JSON file so a restart does not reopen the window.
    """

    def __init__(self, path: Path | None = None, limit: int = 10_000):
        self.path = path
        self.limit = limit
        self._ids: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        if path is not None and path.is_file():
            self._ids.update(json.loads(path.read_text()))

    def add(self, delivery_id: str, timestamp: float, forget_before: float) -> bool:
        """Record the id; False when it was recorded already (a replay)."""
        with self._lock:
            for old in [i for i, sent in self._ids.items() if sent < forget_before]:
                del self._ids[old]
            if delivery_id in self._ids:
                return False
            self._ids[delivery_id] = timestamp
            while len(self._ids) > self.limit:
                self._ids.popitem(last=False)
            self._save()
            return True

    def discard(self, delivery_id: str) -> None:
        """Forget an id, so that MLflow's retry of a delivery we failed to act on is taken."""
        with self._lock:
            self._ids.pop(delivery_id, None)
            self._save()

    def __contains__(self, delivery_id: object) -> bool:
        return delivery_id in self._ids

    def _save(self) -> None:
        if self.path is not None:
            partial = self.path.with_name(self.path.name + ".partial")
            partial.write_text(json.dumps(self._ids))
            partial.replace(self.path)


def signature(secret: str, delivery_id: str, timestamp: str, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256>` of `{delivery_id}.{timestamp}.{body}`, as MLflow signs."""
    content = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), content, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float,
           seen_deliveries: SeenDeliveries, tolerance_s: float = 300,
           events: Collection[str] = (VERSION_CREATED,)) -> dict:
    """The payload of an authentic, fresh, first delivery of one of `events`, or WebhookRejected."""
    lower = {name.lower(): value for name, value in headers.items()}
    signed = lower.get(SIGNATURE_HEADER.lower())
    delivery_id = lower.get(DELIVERY_ID_HEADER.lower())
    timestamp = lower.get(TIMESTAMP_HEADER.lower())
    if not signed:
        raise WebhookRejected(f"unsigned: no {SIGNATURE_HEADER} header (give the MLflow webhook "
                              "the receiver's secret)")
    if not delivery_id or not timestamp:
        raise WebhookRejected(f"missing {DELIVERY_ID_HEADER} or {TIMESTAMP_HEADER} header")
    try:
        sent = int(timestamp)
    except ValueError:
        raise WebhookRejected(f"bad {TIMESTAMP_HEADER} {timestamp!r}: not unix seconds") from None
    expected = signature(secret, delivery_id, timestamp, body).encode()
    # Space-separated signatures are allowed (Standard Webhooks); MLflow sends one.
    if not any(hmac.compare_digest(given.encode(), expected) for given in signed.split()):
        raise WebhookRejected("bad signature: not signed with this receiver's secret, or altered")
    age = now - sent
    if age > tolerance_s:
        raise WebhookRejected(f"stale: sent {age:.0f} s ago (tolerance {tolerance_s:g} s)")
    if age < -tolerance_s:
        raise WebhookRejected(f"from the future: sent {-age:.0f} s ahead of this clock "
                              f"(tolerance {tolerance_s:g} s)")
    if not seen_deliveries.add(delivery_id, sent, forget_before=now - tolerance_s):
        raise WebhookRejected(f"replayed: delivery {delivery_id} was accepted before")
    try:
        payload = json.loads(body)
    except ValueError as err:
        raise WebhookRejected(f"body is not JSON: {err}", 400) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
        raise WebhookRejected("not an MLflow webhook payload: no 'data' object", 400)
    event = f"{payload.get('entity')}.{payload.get('action')}"
    if event not in events:
        raise WebhookIgnored(f"event {event!r} is not acted on (only: {', '.join(events)})")
    data = payload["data"]
    if event == VERSION_CREATED and not (data.get("name") and data.get("version")):
        raise WebhookRejected(f"{event} payload without data.name and data.version", 400)
    return payload


def make_app(secret: str, on_candidate: Callable[[str, str], None],
             seen: SeenDeliveries | None = None, tolerance_s: float = 300,
             clock: Callable[[], float] = time.time) -> FastAPI:
    """`POST /webhook`: 200 accepted / ignored, 401 not authentic, 400 malformed, 503 not acted on."""
    if not secret:
        raise QuantgateError("a webhook secret is required: unsigned deliveries are refused")
    seen = seen if seen is not None else SeenDeliveries()
    app = FastAPI(title="quantgate webhook", docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/webhook")
    async def webhook(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            payload = verify(secret, request.headers, body, clock(), seen, tolerance_s)
        except WebhookIgnored as err:
            return JSONResponse({"status": "ignored", "reason": str(err)})
        except WebhookRejected as err:
            log.warning("webhook rejected: %s", err)
            return JSONResponse({"status": "rejected", "reason": str(err)}, err.status_code)
        model, version = payload["data"]["name"], str(payload["data"]["version"])
        try:
            await run_in_threadpool(on_candidate, model, version)
        except Exception as err:  # answer 5xx so that MLflow retries; the poller also finds it
            seen.discard(request.headers[DELIVERY_ID_HEADER])
            log.exception("webhook: taking %s@%s failed", model, version)
            return JSONResponse({"status": "error", "reason": f"{type(err).__name__}: {err}"}, 503)
        return JSONResponse({"status": "accepted", "key": f"{model}@{version}"})

    return app


class WebhookServer:
    """uvicorn serving the receiver in a background thread; a context manager."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.port = port  # the bound one once started
        self.thread = threading.Thread(target=self.server.run, name="quantgate-webhook", daemon=True)

    def start(self, timeout_s: float = 15) -> WebhookServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                config = self.server.config
                raise QuantgateError(f"webhook receiver did not start on {config.host}:{config.port}"
                                     " (port taken? see the log above)")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.server.config.host}:{self.port}/webhook"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> WebhookServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_webhook(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> WebhookServer:
    """Start the receiver; port 0 picks a free one (see `.url`). Stop it with `.stop()`."""
    return WebhookServer(app, host, port).start()
