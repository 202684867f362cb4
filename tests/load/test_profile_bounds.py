"""A load profile's numbers no one means are refused where the profile is read, in one line naming
the file, the field and the value; a window longer than a day only when asked for (`soak`)."""

from __future__ import annotations

import pytest

from infra.errors import SpecError
from load.profile import load_profile
from tests.load.test_profile import GOOD, write


def test_a_window_over_a_day_needs_soak_and_says_so(tmp_path):
    text = GOOD.replace("duration_s: 15", "duration_s: 172800")
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as raised:
        load_profile(path)
    assert str(raised.value) == (
        f"{path}: field 'duration_s': at most 86,400 s (a day: a longer wait cannot be meant; set "
        "soak: true to ask for up to 30 days); give a smaller value (got 172800)")
    soak = load_profile(write(tmp_path, text + "soak: true\n"))
    assert soak.duration_s == 172_800 and soak.model_dump(mode="json")["soak"] is True


def test_a_profile_without_soak_keys_its_stages_as_before(tmp_path):
    assert "soak" not in load_profile(write(tmp_path, GOOD)).model_dump(mode="json")


@pytest.mark.parametrize(("change", "expected"), [
    ("duration_s: 1.0e+18\nsoak: true\n", "field 'duration_s': at most 2,592,000 s (30 days, even "
     "for a soak run); give a smaller value (got 1e+18)"),
    ("duration_s: .inf\nsoak: true\n", "field 'duration_s': Input should be a finite number (got "
     "inf)"),
    ("request_timeout_s: 172800\nsoak: true\n", "field 'request_timeout_s': at most 86,400 s"),
    ("warmup_s: 1.0e+18\n", "field 'warmup_s': at most 86,400 s"),
    ("capacity: {duration_s: .inf}\n", "field 'capacity.duration_s': Input should be a finite "
     "number (got inf)"),
])
def test_soak_lifts_only_the_measured_window_and_never_past_30_days(tmp_path, change, expected):
    text = "\n".join(line for line in GOOD.splitlines()
                     if not line.startswith(change.split(":")[0])) + "\n" + change
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as raised:
        load_profile(path)
    assert str(raised.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(raised.value)
