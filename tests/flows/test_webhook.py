"""The webhook receiver against deliveries made by MLflow's own sending code."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from flows.webhook import SeenDeliveries, WebhookRejected, make_app, serve_webhook, verify
from infra.errors import QuantgateError

SECRET = "s3cret-for-tests"


class Captured:
    """A stand-in for MLflow's requests session: keeps the request instead of sending it."""

    def post(self, url: str, data: bytes, headers: dict, timeout: float) -> None:
        self.url, self.body, self.headers = url, data, headers


def mlflow_delivery(monkeypatch: pytest.MonkeyPatch, secret: str | None = SECRET,
                    event: str = "model_version.created") -> tuple[dict, bytes]:
    """Headers and body exactly as mlflow/webhooks/delivery.py `_send_webhook_request` makes them."""
    from mlflow.entities.webhook import Webhook, WebhookEvent
    from mlflow.webhooks.delivery import _send_webhook_request

    monkeypatch.setenv("MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS", "true")  # no DNS look-up of the URL
    hook = Webhook(webhook_id="w1", name="quantgate", url="https://quantgate.example/webhook",
                   events=[WebhookEvent.from_str(event)], creation_timestamp=0,
                   last_updated_timestamp=0, secret=secret)
    data = {"name": "tiny-llama", "version": "7", "source": "mlflow-artifacts:/1/r/artifacts/c",
            "run_id": "r", "tags": {"quantgate.spec": "/specs/demo.yaml"}, "description": None}
    if event != "model_version.created":
        data = {"name": "tiny-llama", "version": "7", "key": "k", "value": "v"}
    session = Captured()
    _send_webhook_request(hook, data, WebhookEvent.from_str(event), session)
    return session.headers, session.body


def post(client: TestClient, headers: dict, body: bytes) -> httpx.Response:
    return client.post("/webhook", content=body, headers=headers)


@pytest.fixture
def received() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def client(received: list) -> TestClient:
    return TestClient(make_app(SECRET, lambda model, version: received.append((model, version))))


def test_a_delivery_signed_by_mlflow_is_accepted_once(monkeypatch, client, received):
    headers, body = mlflow_delivery(monkeypatch)
    assert post(client, headers, body).json() == {"status": "accepted", "key": "tiny-llama@7"}
    assert received == [("tiny-llama", "7")]

    replay = post(client, headers, body)
    assert replay.status_code == 401
    assert replay.json()["reason"].startswith("replayed: delivery ")
    assert received == [("tiny-llama", "7")]


@pytest.mark.parametrize(("change", "reason"), [
    ("unsigned", "unsigned: no X-MLflow-Signature header"),
    ("wrong secret", "bad signature"),
    ("tampered body", "bad signature"),
    ("tampered timestamp", "bad signature"),
    ("no delivery id", "missing X-MLflow-Delivery-Id"),
])
def test_an_unauthentic_delivery_is_refused_with_its_reason(monkeypatch, client, received, change,
                                                            reason):
    secret = {"unsigned": None, "wrong secret": "guessed"}.get(change, SECRET)
    headers, body = mlflow_delivery(monkeypatch, secret=secret)
    if change == "tampered body":
        body = body.replace(b'"version": "7"', b'"version": "8"')
        assert b'"version": "8"' in body
    elif change == "tampered timestamp":
        headers["X-MLflow-Timestamp"] = str(int(headers["X-MLflow-Timestamp"]) + 1)
    elif change == "no delivery id":
        del headers["X-MLflow-Delivery-Id"]
    answer = post(client, headers, body)
    assert answer.status_code == 401
    assert answer.json()["status"] == "rejected"
    assert answer.json()["reason"].startswith(reason)
    assert received == []


@pytest.mark.parametrize(("skew_s", "reason"), [(301, "stale: sent 301 s ago"),
                                                (-301, "from the future: sent 301 s ahead")])
def test_a_delivery_outside_the_time_window_is_refused(monkeypatch, received, skew_s, reason):
    headers, body = mlflow_delivery(monkeypatch)
    sent = int(headers["X-MLflow-Timestamp"])
    client = TestClient(make_app(SECRET, lambda m, v: received.append((m, v)),
                                 clock=lambda: sent + skew_s))
    answer = post(client, headers, body)
    assert (answer.status_code, answer.json()["reason"][:len(reason)]) == (401, reason)
    assert received == []
    inside = TestClient(make_app(SECRET, lambda m, v: received.append((m, v)),
                                 clock=lambda: sent + skew_s * 299 / 301))
    assert post(inside, headers, body).status_code == 200


def test_other_events_are_ignored_but_answered(monkeypatch, client, received):
    headers, body = mlflow_delivery(monkeypatch, event="model_version_tag.set")
    answer = post(client, headers, body)
    assert answer.status_code == 200
    assert answer.json()["status"] == "ignored"
    assert "'model_version_tag.set' is not acted on" in answer.json()["reason"]
    assert received == []


def test_a_failed_hand_over_answers_503_and_takes_mlflows_retry(monkeypatch):
    calls = []

    def flaky(model: str, version: str) -> None:
        calls.append((model, version))
        if len(calls) == 1:
            raise RuntimeError("prefect is down")

    client = TestClient(make_app(SECRET, flaky))
    headers, body = mlflow_delivery(monkeypatch)
    first = post(client, headers, body)
    assert (first.status_code, first.json()["reason"]) == (503, "RuntimeError: prefect is down")
    assert post(client, headers, body).json()["status"] == "accepted"  # the same delivery, retried
    assert calls == [("tiny-llama", "7")] * 2


def test_seen_deliveries_survive_a_restart(monkeypatch, tmp_path: Path):
    headers, body = mlflow_delivery(monkeypatch)
    now = int(headers["X-MLflow-Timestamp"])
    verify(SECRET, headers, body, now, SeenDeliveries(tmp_path / "seen.json"))
    with pytest.raises(WebhookRejected, match="^replayed"):
        verify(SECRET, headers, body, now, SeenDeliveries(tmp_path / "seen.json"))


def test_an_empty_secret_is_refused():
    with pytest.raises(QuantgateError, match="secret is required"):
        make_app("", lambda model, version: None)


def test_the_receiver_serves_over_http_and_stops(monkeypatch, received):
    app = make_app(SECRET, lambda model, version: received.append((model, version)))
    headers, body = mlflow_delivery(monkeypatch)
    with serve_webhook(app) as server:
        answer = httpx.post(server.url, content=body, headers=headers, timeout=5)
        assert answer.json() == {"status": "accepted", "key": "tiny-llama@7"}
    assert received == [("tiny-llama", "7")]
    with pytest.raises(httpx.ConnectError):
        httpx.post(server.url, content=body, headers=headers, timeout=2)
    assert not server.thread.is_alive()
