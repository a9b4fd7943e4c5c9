"""Plans at the counts people buy (`simfog plan --gpus/--nodes`, no target) and the cost columns of `sweep` and
`curve` with a catalogue, end to end, on costs worked by hand.

The network is (almost) free, so a GPU delivers 80 samples/s (0.05 s forward + 0.05 s backward, batch 8) whatever
the count: the hand-checkable numbers are GPUs x price per hour, and an epoch of 288,000 samples takes
288,000 / (80 x GPUs) s.
"""

from __future__ import annotations

import csv
import json

import pytest

from simfog import cli

from .conftest import make_trace

CATALOGUE = """
currency = "EUR"
note = "test prices"

[[option]]
name = "cheap"
gpus_per_node = 8
max_nodes = 4
intra_bandwidth = "1000TB/s"
nic_bandwidth = "1000TB/s"
price_per_gpu_hour = 1.0
collectives = ["ring"]

[[option]]
name = "dear"
gpus_per_node = 4
max_nodes = 2
intra_bandwidth = "1000TB/s"
nic_bandwidth = "1000TB/s"
price_per_gpu_hour = 3.0
collectives = ["ring"]
"""

EXPERIMENT = """
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 1
gpus_per_node = 4
intra_bandwidth = "1000TB/s"
nic_bandwidth = "1000TB/s"
[comm]
collective = "ring"
"""


@pytest.fixture
def files(tmp_path):
    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    (tmp_path / "cat.toml").write_text(CATALOGUE)
    (tmp_path / "e.toml").write_text(EXPERIMENT)
    return tmp_path


def test_plan_gpus_prices_every_option_at_each_count(files, capsys):
    out = files / "p" / "plan"
    assert cli.main(["plan", str(files / "t.json"), "--catalogue", str(files / "cat.toml"), "--gpus", "16,4,8",
                     "--epoch-samples", "288000", "-o", str(out.parent), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    rows = [(r["gpus"], r["option"], r["error"]) for r in j["rows"]]
    # sorted by GPUs, then cost; "dear" has 4-GPU nodes and 2 of them: 16 GPUs are more than it has
    assert rows == [(4, "cheap", ""), (4, "dear", ""), (8, "cheap", ""), (8, "dear", ""), (16, "cheap", ""),
                    (16, "dear", "16 GPUs need more than the option's 2 nodes")]
    by = {(r["gpus"], r["option"]): r for r in j["rows"]}
    for (gpus, option), price in (((4, "cheap"), 1.0), ((4, "dear"), 3.0), ((8, "cheap"), 1.0), ((8, "dear"), 3.0),
                                  ((16, "cheap"), 1.0)):
        r = by[gpus, option]
        assert r["cost_per_hour"] == gpus * price
        assert r["samples_per_s"] == pytest.approx(80 * gpus, rel=1e-6)
        assert r["epoch_time_s"] == pytest.approx(288000 / (80 * gpus), rel=1e-6)
        # 16 GPUs of "cheap": 16 EUR/h for 225 s = 1 EUR; 8 of "dear": 24 EUR/h for 450 s = 3 EUR
        assert r["cost_per_epoch"] == pytest.approx(price * 288000 / 80 / 3600, rel=1e-6)
    assert by[8, "dear"]["nodes"] == 2 and by[8, "cheap"]["nodes"] == 1
    assert j["currency"] == "EUR" and j["gpus"] == [16, 4, 8]
    assert len(list(csv.DictReader(open(f"{out}.csv")))) == 6


def test_plan_nodes_and_the_table(files, capsys):
    assert cli.main(["plan", str(files / "t.json"), "--catalogue", str(files / "cat.toml"), "--nodes", "1,2",
                     "-o", str(files / "n")]) == 0
    out = capsys.readouterr().out
    assert "at nodes 1, 2" in out and "by GPUs, then cost per hour" in out
    lines = [line.split() for line in out.splitlines() if line.strip().startswith(("4 ", "8 ", "16 "))]
    # 1 node: 8 of cheap (8 EUR/h), 4 of dear (12 EUR/h); 2 nodes: 16 of cheap (16), 8 of dear (24)
    assert [(x[0], x[2], x[-1]) for x in lines] == [("4", "dear", "12.00"), ("8", "cheap", "8.00"),
                                                    ("8", "dear", "24.00"), ("16", "cheap", "16.00")]


@pytest.mark.parametrize("argv, flag", [(["--gpus", "16", "--nodes", "2"], "--nodes"),
                                        (["--gpus", "16", "--target-samples-per-s", "5"], "--target-samples-per-s"),
                                        (["--gpus", "a,b"], "--gpus"), (["--nodes", "0"], "--nodes")])
def test_plan_counts_refused(files, capsys, argv, flag):
    assert cli.main(["plan", str(files / "t.json"), "--catalogue", str(files / "cat.toml"), *argv,
                     "-o", str(files / "x")]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and not (files / "x").exists()


def test_sweep_and_curve_gain_cost_columns(files, capsys):
    common = ["--catalogue", str(files / "cat.toml"), "--option", "dear", "--epoch-samples", "288000", "--json"]
    assert cli.main(["sweep", str(files / "e.toml"), "--ranks", "4,8", "-o", str(files / "s.csv"), *common]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["currency"] == "EUR"
    for r in j["rows"]:
        assert r["price_per_gpu_hour"] == 3.0 and r["cost_per_hour"] == 3.0 * r["ranks"]
        assert r["cost_per_epoch"] == pytest.approx(3.0 * 288000 / 80 / 3600, rel=1e-6)
    assert cli.main(["curve", str(files / "e.toml"), "--ranks", "4,8", "-o", str(files / "c"), *common[:4]]) == 0
    out = capsys.readouterr().out
    assert "EUR/h" in out and "12.00" in out and "24.00" in out
    # the catalogue's only option needs no name; several do
    assert cli.main(["sweep", str(files / "e.toml"), "--catalogue", str(files / "cat.toml"),
                     "-o", str(files / "s2.csv")]) == 2
    assert "--option" in capsys.readouterr().err
    assert cli.main(["sweep", str(files / "e.toml"), "--option", "dear", "-o", str(files / "s3.csv")]) == 2
    assert "--catalogue" in capsys.readouterr().err


def test_o_names_a_folder_for_commands_writing_several_files(files, capsys):
    (files / "afile").write_text("x")
    for argv in (["plan", str(files / "t.json"), "--catalogue", str(files / "cat.toml"), "--gpus", "4"],
                 ["tune", str(files / "e.toml"), "--points", "2", "--refine", "0"],
                 ["curve", str(files / "e.toml"), "--ranks", "4", "--jobs", "1"]):
        assert cli.main([*argv, "-o", str(files / "afile")]) == 2
        err = capsys.readouterr().err
        assert "-o" in err and "afile" in err and "a folder" in err and "Traceback" not in err
        assert cli.main([*argv, "-o", str(files / "out")]) == 0
        capsys.readouterr()
        assert (files / "out" / f"{argv[0]}.csv").is_file()
    assert (files / "afile").read_text() == "x"


def test_every_plan_and_tune_csv_row_names_its_trace_and_network_file(files, tmp_path):
    """As a sweep's rows do (issue: inputs that do not fit each other are named): the trace's path and the network
    file each row was simulated with ("none" where the option writes its links)."""
    import csv as _csv

    from simfog import cli
    from simfog.plan import load_catalogue

    trace, cat = files / "t.json", files / "cat.toml"
    options = {o.name: o for o in load_catalogue(cat).options}
    assert cli.main(["plan", str(trace), "--catalogue", str(cat), "--gpus", "2,8", "-o", str(tmp_path / "p")]) == 0
    rows = list(_csv.DictReader(open(tmp_path / "p" / "plan.csv", newline="")))
    assert rows and all(r["trace"] == str(trace.resolve()) for r in rows)
    for r in rows:
        net = options[r["option"]].network
        assert r["network_file"] == (net.path if net is not None else "none")
    for argv in ([], ["--merge", "ddp"]):
        out = tmp_path / ("t" + "".join(argv))
        assert cli.main(["tune", str(files / "e.toml"), *argv, "-o", str(out)]) == 0
        rows = list(_csv.DictReader(open(out / "tune.csv", newline="")))
        assert rows and all(r["trace"] == str(trace.resolve()) and r["network_file"] == "none" for r in rows)
