"""Fixtures the fuzzers share (tests/flows/test_fuzz.py, test_fuzz_hostile.py)."""

from __future__ import annotations

import pytest

from tests.flows.test_bad_inputs import base_spec
from tests.infra.test_cpu_support import AVX512


@pytest.fixture
def workspace(tmp_path_factory, monkeypatch):
    """One base spec for all examples; results, reports and MLflow inside the workspace."""
    root = tmp_path_factory.mktemp("fuzz")
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    monkeypatch.setenv("QG_RESULTS_DIR", str(root / "runs"))
    monkeypatch.setenv("QG_REPORTS_DIR", str(root / "reports"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    monkeypatch.chdir(root)

    def never(*args, **kwargs):
        raise AssertionError("a spec validate refused reached the acceptance flow")

    monkeypatch.setattr("flows.acceptance.acceptance", never)
    return root, base_spec(root)
