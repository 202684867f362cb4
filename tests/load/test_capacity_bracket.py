from load.capacity import bracket_from_levels
from load.results import LoadSummary


def level(name: str, users: int, rps: float, goodput: float | None = 1.0) -> LoadSummary:
    return LoadSummary(level=name, users=users, requests=12, errors=0, error_rate=0.0,
                       duration_s=12 / rps if rps else 1.0, requests_per_s=rps,
                       output_tokens_per_s=32 * rps, goodput=goodput)


def test_the_levels_bound_the_search():
    lower, upper, note = bracket_from_levels(level("low", 1, 0.8), level("high", 4, 2.0),
                                             0.99, 0.1, 8.0)
    assert (lower, upper) == (0.4, 2.5)
    assert "0.8 at 1 user(s), 2 at 4" in note


def test_the_profile_bounds_still_hold():
    lower, upper, _ = bracket_from_levels(level("low", 1, 0.8), level("high", 4, 2.0),
                                          0.99, 0.5, 1.0)
    assert (lower, upper) == (0.5, 1.0)


def test_no_throughput_falls_back_to_the_profile_and_a_slow_single_user_is_said():
    assert bracket_from_levels(level("low", 1, 0.0), level("high", 4, 0.0), 0.99, 0.1, 8.0)[:2] \
        == (0.1, 8.0)
    note = bracket_from_levels(level("low", 1, 0.8, goodput=0.5), level("high", 4, 2.0),
                               0.99, 0.1, 8.0)[2]
    assert "one user at a time already meets the SLO for only 50%" in note


def test_find_capacity_searches_inside_the_levels_bracket(monkeypatch, tmp_path):
    from load import runner
    from load.profile import load_profile

    asked = {}

    def search(evaluate, lower, upper, iterations, min_passes=False, ceiling=None):
        asked.update(lower=lower, upper=upper)
        asked["min_passes"] = min_passes
        return upper, "censored", []

    monkeypatch.setattr(runner, "search_capacity", search)
    profile = load_profile("demo")
    levels = {"low": level("low", 1, 0.3), "high": level("high", 4, 0.6)}
    capacity, note, _ = runner.find_capacity("http://x", "m", profile, tmp_path, levels=levels)
    assert asked == {"lower": 0.15, "upper": 0.75, "min_passes": True} and capacity == 0.75
    assert note.startswith("censored; bracket 0.15-0.75 req/s from the levels' throughput")
    runner.find_capacity("http://x", "m", profile, tmp_path)
    assert asked == {"lower": profile.capacity.min_rate, "upper": profile.capacity.max_rate,
                     "min_passes": False}
    assert note.endswith("0.15 req/s not probed: both levels met the SLO for 100% of requests")
    met = dict(levels)
    met["high"] = met["high"].model_copy(update={"goodput": 0.9})
    runner.find_capacity("http://x", "m", profile, tmp_path, levels=met)
    assert asked["min_passes"] is False
