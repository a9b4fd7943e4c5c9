"""`simfog curve`: the CSV's rows and numbers, and figures that are valid PNG and SVG files."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET

import pytest

from simfog import cli
from simfog.commands.curve import parse_ranks
from simfog.errors import ConfigError

from .conftest import make_trace

# Free communication (T = 0 + 0·M): every rank computes 0.03 + 0.05 s per iteration, batch 8.
EXP = """
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 1
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
collective = "linear"
alpha = "{alpha}"
beta = "{beta}"
"""
RANKS = [2 ** k for k in range(1, 12)]  # 2 .. 2048
ONE_RANK = 8 / 0.08                     # samples/s of one rank


@pytest.fixture
def exp_file(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")

    def write(alpha="0us", beta="0ns/B"):
        path = tmp_path / "e.toml"
        path.write_text(EXP.format(alpha=alpha, beta=beta))
        return path
    return write


def read(path):
    return list(csv.DictReader(open(path)))


def test_free_communication_scales_perfectly_up_to_2048_ranks(exp_file, tmp_path, capsys):
    prefix = tmp_path / "c" / "curve"  # -o DIR writes DIR/curve.csv, .png, .svg
    argv = ["curve", str(exp_file()), "--ranks", "2,4,...,2048", "--merge", "wfbp,single,mgwfbp",
            "-o", str(prefix.parent), "--jobs", "1", "--no-progress"]
    assert cli.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    rows = read(f"{prefix}.csv")
    assert len(rows) == len(RANKS) * 3
    assert {(int(r["ranks"]), r["merge"]) for r in rows} == {(n, m) for n in RANKS
                                                             for m in ("wfbp", "single", "mgwfbp")}
    for m in ("wfbp", "single", "mgwfbp"):
        series = sorted((int(r["ranks"]), float(r["samples_per_s"]), float(r["scaling_efficiency"]))
                        for r in rows if r["merge"] == m)
        assert all(r["error"] == "" for r in rows)
        assert [e for _, _, e in series] == pytest.approx([1.0] * len(RANKS), rel=1e-12)
        assert [s for _, s, _ in series] == pytest.approx([n * ONE_RANK for n in RANKS], rel=1e-12)
        assert all(a[1] < b[1] for a, b in zip(series, series[1:], strict=False))  # strictly rising throughput
    assert open(f"{prefix}.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    root = ET.parse(f"{prefix}.svg").getroot()
    assert root.tag in ("svg", "{http://www.w3.org/2000/svg}svg")


def test_costly_communication_lowers_efficiency_and_reruns_resume(exp_file, tmp_path, capsys):
    # T = 10 ms + 1 ns/B, single bucket of 3 MB: 13 ms exposed after 80 ms of compute at every rank count > 1.
    path = exp_file(alpha="10ms", beta="1ns/B")
    prefix = tmp_path / "c" / "curve"  # -o DIR writes DIR/curve.csv, .png, .svg
    argv = ["curve", str(path), "--ranks", "2,4,8", "--merge", "single", "-o", str(prefix.parent), "--jobs", "1",
            "--no-progress"]
    assert cli.main(argv) == 0
    first = open(f"{prefix}.csv").read()
    for r in read(f"{prefix}.csv"):
        assert float(r["scaling_efficiency"]) == pytest.approx(0.08 / 0.093, rel=1e-12)
    assert cli.main(argv) == 0  # everything done: nothing re-run, nothing duplicated
    assert open(f"{prefix}.csv").read() == first
    # A wider request appends only the new points; the figure shows only what was asked for.
    assert cli.main([*argv[:5], "single,wfbp", *argv[6:]]) == 0
    rows = read(f"{prefix}.csv")
    # (the file is then sorted by the sweep's axes, so the first rows are kept whole, not as its first lines)
    assert set(first.splitlines()) <= set(open(f"{prefix}.csv").read().splitlines()) and len(rows) == 6
    capsys.readouterr()


def test_collectives_as_series_and_error_points_are_reported(exp_file, tmp_path, capsys):
    # rhd needs a power of two: 6 ranks give an error row, which is kept in the CSV and left out of the figure.
    prefix = tmp_path / "c" / "curve"  # -o DIR writes DIR/curve.csv, .png, .svg
    assert cli.main(["curve", str(exp_file()), "--ranks", "2,4,6", "--collective", "ring,rhd", "--merge", "single",
                     "-o", str(prefix.parent), "--jobs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1 point(s) could not run" in out
    rows = read(f"{prefix}.csv")
    assert [(r["ranks"], r["collective"]) for r in rows if r["error"]] == [("6", "rhd")]


@pytest.mark.parametrize("text, ranks", [
    ("4,8,...,2048", [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]),
    ("8,16,...,64", [8, 16, 32, 64]),
    ("4,6,...,12", [4, 6, 8, 10, 12]),
    ("1,4,16", [1, 4, 16]),
])
def test_parse_ranks(text, ranks):
    assert parse_ranks(text) == ranks


@pytest.mark.parametrize("text", ["4,8,...,100", "4,...,64", "8,4,...,1", "a,b", "4,8,...,x"])
def test_parse_ranks_rejects(text):
    with pytest.raises(ConfigError) as e:
        parse_ranks(text)
    assert e.value.field == "--ranks"


@pytest.mark.parametrize("variation, iterations, tolerance", [("expected", 2, 1e-7), ("draw", 400, 0.004)])
def test_stragglers_show_at_scale(exp_file, tmp_path, variation, iterations, tolerance, capsys):
    """Per-call spread 5 % on every link (simfog.variation), one 3 MB bucket after backward on T = 10 ms + 1 ns/B
    = 13 ms at every rank count: a synchronous collective pays its slowest rank, whose expected factor is
    1 + 0.05·(√6/π)·ln n: 1.0810667 at 8 ranks (ln 8 = 2.0794415), 1.2972446 at 2,048 (ln 2048 = 7.6246190);
    iterations of 80 + 13·1.0810667 = 94.0538671 ms and 80 + 13·1.2972446 = 96.8641798 ms, efficiencies 0.850576
    and 0.825899. "expected" gives them exactly; 400 drawn iterations average to them within 4 standard errors of the
    mean (the factor's deviation is 0.05 at any n: 13 ms · 0.05 / √399 = 0.033 ms, 0.035 % of an iteration)."""
    path = exp_file(alpha="10ms", beta="1ns/B")
    text = path.read_text().replace("iterations = 2", f"iterations = {iterations}")
    text = text.replace('nic_bandwidth = "10Gbit/s"', 'nic_bandwidth = "10Gbit/s"\nnic_spread = 0.05\n'
                        "intra_spread = 0.05")
    path.write_text(text + f'variation = "{variation}"\n')
    out = tmp_path / "c"
    assert cli.main(["curve", str(path), "--ranks", "8,2048", "--merge", "single", "-o", str(out), "--jobs", "1",
                     "--no-progress"]) == 0
    capsys.readouterr()
    efficiency = {int(r["ranks"]): float(r["scaling_efficiency"]) for r in read(out / "curve.csv")}
    assert efficiency[8] == pytest.approx(0.080 / 0.0940538671, rel=tolerance)
    assert efficiency[2048] == pytest.approx(0.080 / 0.0968641798, rel=tolerance)
    assert efficiency[2048] < efficiency[8] < 0.080 / 0.093  # without the spread: 0.860215 at every count
