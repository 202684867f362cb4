"""Gate-test markers."""

from __future__ import annotations


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "chromium: renders the sign-off report in headless Chromium (Debian's `chromium` package; "
        "CI installs it, so the test fails rather than skips when it is missing)",
    )
