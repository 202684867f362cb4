"""The web UI launcher's lines name the server it looks at, never the password its URL holds."""

from __future__ import annotations

from pathlib import Path

from load import webui


class _StoppedUI:
    """A web UI that came up and went at once: open_webui prints its lines and returns."""

    users, url, samples_path, process = 4, "http://127.0.0.1:8089", Path("samples.jsonl"), None

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self) -> _StoppedUI:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_the_base_url_is_printed_without_its_password(monkeypatch, capsys):
    monkeypatch.setattr(webui, "WebUI", _StoppedUI)
    webui.open_webui("http://alice:pw-7f3a9c1e@10.0.0.5:8000", "m")
    out = capsys.readouterr().out
    assert "Locust web UI for http://alice:<redacted>@10.0.0.5:8000 (m, high: 4 users)" in out
    assert "pw-7f3a9c1e" not in out
