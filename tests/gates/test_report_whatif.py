"""The sign-off report's capacity what-if section, in HTML and Markdown."""

from __future__ import annotations

from functools import partial
from html.parser import HTMLParser

import pytest

from gates.decide import decide
from gates.policy import GatePolicy
from gates.report import write_report
from gates.whatif.section import whatif_section
from tests.gates.test_whatif_section import CPU, QUICK, WORKLOAD, records


class Tables(HTMLParser):
    """Cell texts per table id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.current: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.current = attrs.get("id")
            self.tables.setdefault(self.current or "", [])
        elif tag == "tr" and self.current:
            self.tables[self.current].append([])
        elif tag == "td" and self.current:
            self.tables[self.current][-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.current = None

    def handle_data(self, data):
        rows = self.tables.get(self.current or "")
        if rows and rows[-1]:
            rows[-1][-1] += data


@pytest.fixture(scope="module")
def report(tmp_path_factory, monkeypatch_module):
    stages = records(tmp_path_factory.mktemp("checkpoints"))
    # A short simulation and a fixed CPU: the test does not depend on the machine it runs on.
    monkeypatch_module.setattr("gates.report.whatif_section",
                               partial(whatif_section, settings=QUICK, cpu_settings=QUICK,
                                       cpu_described=CPU))
    verdict = decide("demo", stages, GatePolicy())
    out = tmp_path_factory.mktemp("report")
    paths = write_report(verdict, stages, out, workload=WORKLOAD, workload_source="profile ci")
    return paths["html"].read_text(), paths["md"].read_text()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_html_section_is_labelled_a_prediction_with_its_tables(report):
    html, _ = report
    assert "Capacity what-if (prediction)" in html and "Prediction, not a measurement." in html
    assert "roofline, efficiencies compute 0.44 of peak" in html
    assert "Workload: the reference GPU serving workload" in html
    parser = Tables()
    parser.feed(html)
    gpus = [row for row in parser.tables["whatif-gpus"] if row]
    assert [row[1] for row in gpus] == ["h100-sxm", "b200"] * 3
    assert gpus[2][0].startswith("w8") and "emulated: real format" in gpus[2][0]
    assert "int8 weights" in gpus[2][-1]
    cpu = {row[0].split()[0]: row for row in parser.tables["whatif-cpu"] if row}
    assert set(cpu) == {"baseline", "w8", "a8"}
    assert "not comparable" in cpu["w8"][-1] and cpu["baseline"][2] == "0%"
    assert "No what-if for gone" in html
    assert "low-load TTFT 60.0 ms and TPOT 20.00 ms" in html


def test_markdown_section_has_the_same_tables(report):
    _, md = report
    assert "## Capacity what-if (prediction)" in md and "**Prediction, not a measurement.**" in md
    assert md.count("| h100-sxm |") == 3 and md.count("| b200 |") == 3
    assert "| w8 (emulated: real format) | h100-sxm |" in md
    assert "### Checked against this run's own measurement (CPU)" in md
    assert "| a8 | " in md and "not comparable" in md
