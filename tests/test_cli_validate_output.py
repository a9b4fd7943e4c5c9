"""`simfog validate -o DIR`: one folder for the files validate writes (simfog.commands.outputs' convention), with
the older --csv, --out, --report and --timeline-dir still naming the same paths. No emulated network: the paths are
resolved from the parsed command line, and the end-to-end runs stand a failed row in for the real runs."""

from __future__ import annotations

import csv
import types

import pytest

from simfog import cli
from simfog.commands.validate import OutputPaths, output_paths

from .test_cli import exp_file  # noqa: F401 (a fixture)


def _paths(*argv: str) -> OutputPaths:
    return output_paths(cli.build_parser().parse_args(["validate", *argv]))


def test_o_is_a_folder_and_the_older_options_name_the_same_paths(tmp_path):
    d = tmp_path / "v"
    new = _paths("e.toml", "-o", str(d), "--report", "--timeline-dir")
    assert (new.csv, new.report, new.timelines) == (str(d / "validation.csv"), str(d / "validation.html"),
                                                    str(d / "timelines"))
    old = _paths("e.toml", "--csv", str(d / "validation.csv"), "--report", str(d / "validation.html"),
                 "--timeline-dir", str(d / "timelines"))
    assert (old.csv, old.report, old.timelines) == (new.csv, new.report, new.timelines)
    # without --report or --timeline-dir, -o writes the CSV only; an older option given beside -o wins
    assert _paths("e.toml", "-o", str(d)) == OutputPaths(str(d / "validation.csv"), str(d), None, None)
    assert _paths("e.toml", "-o", str(d), "--csv", "x.csv").csv == "x.csv"
    # --bench: -o is the bench's folder (--out), its CSV the bench's own bench-validation.csv
    bench = _paths("--bench", "-o", str(d), "--report")
    assert bench == _paths("--bench", "--out", str(d), "--report", str(d / "validation.html"))
    assert bench == OutputPaths(None, str(d), str(d / "validation.html"), None)
    assert _paths("--bench") == OutputPaths(None, "bench-validation", None, None)
    assert _paths("--bench", "--report").report == "bench-validation/validation.html"


def test_help_says_what_o_is(capsys):
    with pytest.raises(SystemExit):
        cli.main(["validate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "-o DIR, --output DIR a folder (made if missing) for the files validate writes" in text
    assert "--csv" in text and "older spelling" in text


@pytest.fixture
def no_real_runs(monkeypatch):
    """validate.run.validate_experiment as a group of one failed row: the command's own path without a network."""
    import validate.run

    row = {"id": "toy single 4r", "model": "toy", "merge": "single", "ranks": 4, "nodes": 2, "ranks_per_node": 2,
           "nic_bandwidth_Bps": 1.25e9, "error": "no real run in this test"}

    def fake(exp, options, merges=None, log=None):
        return types.SimpleNamespace(rows=[row], validations=[], calibration=None, emulated=False, note="")

    monkeypatch.setattr(validate.run, "validate_experiment", fake)


def test_o_writes_the_csv_and_report_where_the_older_options_do(exp_file, tmp_path, capsys,  # noqa: F811
                                                                no_real_runs):
    new, old = tmp_path / "new", tmp_path / "old"
    assert cli.main(["validate", str(exp_file), "--loopback", "-o", str(new), "--report"]) == 1  # the failed row
    err = capsys.readouterr().err
    assert f"wrote {new / 'validation.csv'}" in err and f"wrote {new / 'validation.html'}" in err
    assert cli.main(["validate", str(exp_file), "--loopback", "--csv", str(old / "validation.csv"),
                     "--report", str(old / "validation.html")]) == 1
    capsys.readouterr()
    assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in old.iterdir()) == [
        "validation.csv", "validation.html"]
    assert [r["error"] for r in csv.DictReader(open(new / "validation.csv"))] == ["no real run in this test"]
    # the CSV is not overwritten without --force, refused before anything runs, naming -o
    assert cli.main(["validate", str(exp_file), "--loopback", "-o", str(new)]) == 2
    err = capsys.readouterr().err
    assert f"-o = '{new / 'validation.csv'}'" in err and "add --force" in err
    assert cli.main(["validate", str(exp_file), "--loopback", "-o", str(new), "--force"]) == 1


def test_bad_outputs_are_one_line_errors(exp_file, tmp_path, capsys):  # noqa: F811
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert cli.main(["validate", str(exp_file), "-o", str(a_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"-o = '{a_file}'" in err and "a folder" in err
    assert cli.main(["validate", str(exp_file), "--report"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--report" in err and "-o DIR" in err
