"""`simfog validate --report`: one self-contained HTML page, checked by parsing it and in a real headless browser
(chromium, when installed: page loads with no console error; the table, the error-bar plot, both timelines and the
calibration residuals are in the DOM the browser built)."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from simfog.calibrate import fit
from simfog.simulation import simulate
from simfog.trace import Measurement, NetworkTrace, Provenance
from validate.comparison import compare
from validate.comparison.report import write_report

from ..conftest import make_experiment, make_trace
from .test_validate_run import RANKS

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class _Outline(HTMLParser):
    """Counts what the page is made of: tags, table rows per table id, external references."""

    def __init__(self):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.table = None
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        if tag == "table":
            self.table = a.get("id") or a.get("class") or "?"
        if tag == "tr" and self.table:
            self.rows[self.table] = self.rows.get(self.table, 0) + 1
        for key in ("src", "href"):
            if key in a and not str(a[key]).startswith("#"):
                self.external.append(a[key])
        if tag in ("script", "link"):
            self.external.append(tag)


def _group():
    trace = make_trace([0.1, 0.1], [0.1, 0.1], [1000, 1000])
    exp = make_experiment(trace, nodes=2, gpus_per_node=1, iterations=3)
    measured = compare.measured_result(exp, RANKS, bucket_bytes=[4000, 4000])
    predicted = simulate(exp)
    rows, validations = [], []
    for vid in ("toy-wfbp", "toy-again"):
        row = compare.compare({"id": vid, "model": "toy", "merge": "wfbp", "ranks": 2, "nodes": 2,
                               "ranks_per_node": 1, "bucket_copy_Bps": 2e10,
                               "overheads_source": "measured on X (this host) by the validator (how...)",
                               "host_cpu_model": "AMD EPYC", "host_cores": 2, "host_kernel": "6.1",
                               "host_microbenchmark_s": 0.0421, "host_steal": 0.013,
                               "host_cpu_busy": 0.97 if vid == "toy-again" else 0.4, "host_oversubscribed": 0.1},
                              measured, predicted)
        rows.append(row)
        validations.append(SimpleNamespace(id=vid, experiment=exp, measured=measured, predicted=predicted, row=row))
    failed = compare.failed_row({"id": "toy-broken"}, "launch failed: rank 1 exited 9")
    rows.append(failed)
    net = NetworkTrace("gloo", "tcp", Provenance("test", "2026-11-23", "test"), tuple(
        Measurement("allreduce", 2, 2, b, (1e-4 + b * 1e-8,)) for b in (1000, 10_000, 100_000, 1_000_000)))
    return SimpleNamespace(validations=validations, calibration=fit(net), emulated=True, note="", rows=rows)


def test_page_is_self_contained_with_every_part(tmp_path):
    path = write_report(tmp_path / "r.html", [_group()], title="unit test")
    text = path.read_text()
    outline = _Outline()
    outline.feed(text)
    assert outline.external == []  # no script, stylesheet link or image file: one file carries it all
    assert outline.rows["configurations"] == 1 + 3  # header + three configurations (one failed)
    assert outline.rows["residuals"] == 1 + 4 and outline.rows["fits"] == 1 + 1
    # error bars, 2 timelines (2 configurations with both sides), residual plot
    assert outline.tags["svg"] == 1 + 2 + 1
    assert "launch failed: rank 1 exited 9" in text and "3 configurations</b>, 2 measured" in text
    assert "measured on X (this host) by the validator" in text and "(how...)" not in text
    assert "toy-wfbp: error" in text


@pytest.mark.skipif(BROWSER is None, reason="no headless browser (chromium) on this machine: apt-get install chromium")
def test_page_loads_in_a_headless_browser(tmp_path):
    path = write_report(tmp_path / "r.html", [_group()], title="unit test")
    out = subprocess.run([BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    console = [line for line in out.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    dom = out.stdout
    assert re.search(r"<table id=\"configurations\">", dom)
    assert dom.count("<svg") == 4  # the browser parsed every inline figure
    assert len(re.findall(r"<tr>", dom)) >= 4 + 5 + 2


def test_page_names_the_host_and_marks_host_limited_rows(tmp_path):
    text = write_report(tmp_path / "r.html", [_group()], title="unit test").read_text()
    assert text.count("Host: AMD EPYC, 2 cores, kernel 6.1, fixed single-core microbenchmark 42.1 ms") == 1
    assert text.count("HOST-LIMITED") == 1 + 1  # the legend, and toy-again (CPUs 97 % busy); toy-wfbp is not
    assert "1.3%" in text  # steal
    assert "steal: the share of CPU time a hypervisor took" in text


def test_page_stays_small_timelines_only_for_the_worst(tmp_path):
    # 14 configurations: timelines for the 10 with the largest |error| only, host-limited ones said so
    g = _group()
    base = g.validations[0]
    g.validations = []
    for i in range(14):
        row = {**base.row, "id": f"c{i}", "rel_error": (-1) ** i * i / 100,
               "host_cpu_busy": 0.97 if i == 13 else 0.4}
        g.validations.append(SimpleNamespace(id=f"c{i}", experiment=base.experiment, measured=base.measured,
                                             predicted=base.predicted, row=row))
    g.rows = [v.row for v in g.validations]
    text = write_report(tmp_path / "r.html", [g]).read_text()
    captions = re.findall(r"<figcaption>(c\d+): error", text)
    assert captions == [f"c{i}" for i in range(13, 3, -1)]  # |error| 13 % .. 4 %
    assert "c13: error -13.0% (host-limited" in text
    assert "The 10 configurations with the largest |error| of 14." in text
    # text drawn as text, not glyph outlines (svg.fonttype none): the ids are readable in the SVG
    assert re.search(r"<text[^>]*>c13 \(host-limited\)</text>", text)
