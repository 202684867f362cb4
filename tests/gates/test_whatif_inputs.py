"""The what-if refuses a rate its simulation cannot run, in one line naming it and the rate that
fits, before any array is drawn (a huge finite rate was a MemoryError)."""

from __future__ import annotations

import pytest

from gates.whatif import Workload, whatif_table
from gates.whatif.search import SimSettings
from infra.errors import SpecError

SMOLLM = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
          "tie_word_embeddings": True}
STAGES = {"bf16": {"weights": "none", "activations": "none", "kv_cache": "auto"}}


def table(rate: float):
    return whatif_table(SMOLLM, STAGES, ["h100-sxm"], Workload(prompt_tokens=64, output_tokens=8),
                        settings=SimSettings(measured_requests=100, iterations=2), rate=rate)


@pytest.mark.parametrize(("rate", "expected"), [
    (1e9, "--rate 1e+09 req/s: the simulation would draw 1e+10 warm-up arrivals (10 s at that "
          "rate), over 1,000,000 in one run; give a rate of at most 99,990 req/s"),
    (1e300, "--rate 1e+300 req/s: the simulation would draw 1e+301 warm-up arrivals"),
    (float("nan"), "--rate must be a finite number above 0 req/s, got nan"),
    (0.0, "--rate must be a finite number above 0 req/s, got 0"),
])
def test_a_rate_the_simulation_cannot_draw_is_one_line(rate, expected):
    with pytest.raises(SpecError) as raised:
        table(rate)
    assert str(raised.value).startswith(expected)


def test_a_rate_within_the_bound_is_predicted():
    assert table(5.0).loc[0, "rate_rps"] == 5.0
