"""A stage whose URL reaches its parent's server is refused, however the URL is spelt."""

from __future__ import annotations

import re

import pytest

from flows.spec import load_spec
from infra.errors import SpecError
from tests.flows.test_spec import write_spec

OWN = {"activations": "http://127.0.0.1:9003", "kv": "http://127.0.0.1:9004"}


@pytest.mark.parametrize("weights", [
    "http://localhost:9001", "http://localhost:9001/", "http://[::1]:9001", "http://0.0.0.0:9001"])
def test_a_stage_on_the_baselines_server_under_another_name_is_refused(tmp_path, weights):
    engine = {"kind": "external", "url": "http://127.0.0.1:9001",
              "stage_urls": {"weights": weights, **OWN}}
    with pytest.raises(SpecError, match=(
            r"stage 'weights' would be served by its parent 'baseline''s own server "
            rf"\({re.escape(weights.rstrip('/'))}, which http://127.0.0.1:9001 also reaches\) and compared "
            r"with itself; give 'weights' its own URL in stage_urls")):
        load_spec(write_spec(tmp_path, engine=engine))


def test_stages_on_other_ports_of_this_host_pass(tmp_path):
    engine = {"kind": "external", "url": "http://127.0.0.1:9001",
              "stage_urls": {"weights": "http://localhost:9002", **OWN}}
    assert load_spec(write_spec(tmp_path, engine=engine)).engine.stage_urls["weights"] == \
        "http://localhost:9002"
