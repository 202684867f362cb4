"""The sign-off report: files that exist and parse, the numbers a signer reads, and a real render."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

from gates.decide import decide
from gates.policy import GatePolicy
from gates.report import write_report
from infra.cores import plan_cores
from tests.gates.records import chain


class Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))


EARLIER_RUN = "demo-20260101-000000-abc123"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    records = chain()
    records[1].load.capacity_rps = 0.42
    records[1].load.capacity_note = "between 0.42 (passes) and 0.56 (fails) req/s"
    out = tmp_path_factory.mktemp("report")
    # The baseline and a8 were measured in this run (named like the report folder); w8 came
    # from the stage cache, measured in an earlier run.
    for record, key in zip(records, "abc", strict=True):
        record.measured_in, record.cache_key = out.name, key * 64
        record.measured_at = "2026-02-02T10:00:00+00:00"
    records[1].measured_in, records[1].measured_at = EARLIER_RUN, "2026-01-01T09:30:00+00:00"
    # The baseline's load ran on a 2-core box (shared), the others on 16 cores (split).
    records[0].load.record_cores(plan_cores("cpu", usable=[0, 1]))
    for record in records[1:]:
        record.load.record_cores(plan_cores("cpu", usable=range(16)))
    verdict = decide("demo", records, GatePolicy())
    return verdict, records, write_report(verdict, records, out, signer="Ada Lovelace")


def test_report_writes_html_markdown_and_every_figure(report):
    _, _, paths = report
    assert set(paths) == {"html", "md", "model_card", "forest", "long_context", "latency_cdf",
                          "length_ratios"}
    for name in ("forest", "long_context", "latency_cdf", "length_ratios"):
        assert paths[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    parser = Ids()
    parser.feed(paths["html"].read_text())
    assert {"decision", "rollback", "stages", "forest", "long_context", "latency_cdf",
            "length_ratios", "engine", "signoff", "sizes", "load", "cores", "cache-keys"} <= parser.ids
    assert len(parser.images) == 4 and all(s.startswith("data:image/png;base64,") for s in parser.images)


def test_report_states_the_verdict_cis_flips_and_sign_off(report):
    verdict, records, paths = report
    md = paths["md"].read_text()
    assert md.startswith("# demo: GO")
    assert f"Candidate hash | `{verdict.candidate_hash}`" in md
    assert "Signed by | Ada Lovelace" in md
    # the per-stage table shows the paired CI the check was judged on
    a8 = next(c for c in verdict.stages[2].checks if c.rule == "quality.math")
    low = f"{100 * a8.details['ci_low']:+.1f}"
    assert re.search(rf"\| a8 \|.*\[{re.escape(low)}, ", md)
    # flipped items with both responses, correct->wrong first
    assert "### a8 vs w8: 3 flipped (2 correct→wrong)" in md
    assert "| w8 answer 10 | a8 answer 10 |" in md
    assert "![forest plot](forest.png)" in md
    # what each stage served: latency per level from raw samples, and the capacity at the SLO
    assert re.search(r"\| a8 \| high \(c=\d+\) \| \d+ \(0 err\) \| [\d,]+ / [-\d,]+ \| 21 / ", md)
    assert "| w8 | capacity at the SLO | 0.42 req/s: between 0.42 (passes) and 0.56 (fails)" in md
    assert "vllm --model a8" in md  # the rollback plan's exact command line


def test_report_states_its_methods_with_the_policy_it_was_judged_by(tmp_path):
    records = chain()
    policy = GatePolicy.model_validate({"quality": {"max_looks": 4, "max_error_ratio": 3}})
    paths = write_report(decide("demo", records, policy), records, tmp_path)
    md = paths["md"].read_text()
    methods = md[md.index("## How the rules decide"):md.index("## Sign-off")]
    assert "split over 4 looks" in methods and "under 3x the baseline's true errors" in methods
    assert "Tango's score interval" in methods and "right-censored" in methods
    parser = Ids()
    parser.feed(paths["html"].read_text())
    assert "methods" in parser.ids


def test_report_says_where_the_load_generator_ran_against_the_engine(report):
    _, _, paths = report
    md = paths["md"].read_text()
    assert ("- baseline: **load generator and engine shared cores 0-1 (2 usable cores: the engine "
            "needs them all): client overhead is inside the latency figures**.") in md
    assert ("- w8, a8: load generator on cores 0-1, engine on cores 2-15 (16 usable cores: 2 kept "
            "for the load generator): separate cores.") in md
    html = paths["html"].read_text()
    assert '<li class="shared">baseline: load generator and engine shared cores 0-1' in html


def test_report_shows_which_stages_came_from_the_stage_cache(report):
    _, _, paths = report
    md = paths["md"].read_text()
    elsewhere = f"measured in run {EARLIER_RUN} at 2026-01-01T09:30:00+00:00"
    reused = f"{elsewhere} (stage cache {'b' * 12})"
    assert f"| w8 (emulated) ({reused}) |" in md
    assert re.search(r"^\| a8 \| activations", md, re.M)  # measured in this run: no note
    # The sign-off lists every stage's full key and where it was measured.
    assert f"| Stage cache key, baseline | `{'a' * 64}` (measured in this run) |" in md
    assert f"| Stage cache key, w8 | `{'b' * 64}` ({elsewhere}) |" in md
    html = paths["html"].read_text()
    assert f'<span class="small muted reused">{reused}</span>' in html
    assert html.count("<code>" + "c" * 64 + "</code>") == 1


def test_a_report_written_elsewhere_names_the_run_it_reports_on(tmp_path, report):
    verdict, records, _ = report
    # `quantgate gate RUN --report DIR`: DIR's name is not the run's.
    md = write_report(verdict, records, tmp_path / "elsewhere", run=records[0].measured_in)["md"]
    assert md.read_text().count("measured in this run") == 2


def test_unsigned_report_leaves_a_line_to_sign(tmp_path):
    records = chain()
    verdict = decide("demo", records, GatePolicy())
    md = write_report(verdict, records, tmp_path, signer=None)["md"].read_text()
    assert "Signed by | ________________________" in md


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("headless Chromium is needed to render the report: "
                    "apt-get update && apt-get install -y chromium (Debian's package)")
    return found


@pytest.mark.chromium
def test_report_renders_in_headless_chromium_with_its_plots(report):
    from PIL import Image

    _, _, paths = report
    shot = paths["html"].with_name("screenshot.png")
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--window-size=1280,4200", f"--screenshot={shot}",
         paths["html"].resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (4200, 1280)
    # The GO badge (#1a7f37) is drawn near the top, and the page is not blank.
    top = pixels[:200]
    assert (np.abs(top - [0x1A, 0x7F, 0x37]).sum(axis=2) < 30).sum() > 500
    assert (pixels.sum(axis=2) < 600).mean() > 0.01, "page looks empty"
    # The plots rendered: matplotlib's default blue/orange lines are on the page.
    for color in ([0x1F, 0x77, 0xB4], [0xFF, 0x7F, 0x0E]):
        assert (np.abs(pixels - color).sum(axis=2) < 40).sum() > 300, color
    # The forest plot's status colours (inconclusive amber) are there too.
    assert (np.abs(pixels - [0xBF, 0x87, 0x00]).sum(axis=2) < 40).sum() > 100


def test_the_report_says_where_each_stage_s_time_went(tmp_path):
    from gates.record import SetTiming, StageTimings

    records = chain()
    records[1].timings = StageTimings(
        wall_s=200.0, startup_s=30.0, scoring_s=10.0, more_items_s=20.0, load_s=60.0,
        sets={"math": SetTiming(items=120, output_tokens=4000, seconds=50.0)})
    verdict = decide("c", records, GatePolicy())
    out = write_report(verdict, records, tmp_path / "report", whatif_gpus=())
    html, md = out["html"].read_text(), out["md"].read_text()
    assert 'id="timing"' in html and "math 50 s first look (120 items, 4000 tokens in all)" in html
    row = next(line for line in md.splitlines() if line.startswith(f"| {records[1].name} | 200 s"))
    assert "| 30 s |" in row and "| 30 s | 70% |" in row  # overhead 200-30-140, busy 140/200
