"""The log importers on every file of the reference data (bench/data/ref): the layout of each nccl-tests log against
the tables of nccl-tests/PROVENANCE.md, several logs merged into one trace through the `simfog import` command,
a real log cut short, the MG-WFBP OSU logs together, and every other file refused with a ConfigError."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from simfog.errors import ConfigError
from simfog.importers import ImporterWarning, import_file, import_files
from simfog.trace import load_network_trace

from .conftest import REF

ECHO, ABCI, MG = REF / "nccl-tests" / "echo-a100-azure", REF / "nccl-tests" / "abci-v100", REF / "mgwfbp-googlenet"
SIMFOG = Path(sys.executable).with_name("simfog")
A100, V100 = "A100-SXM4-40GB", "Tesla V100-SXM2-16GB"

# nccl-tests/PROVENANCE.md: file, GPUs, nodes (-> GPUs per node), GPU model; rows: the sizes of the table
# (8 B - 1 GiB: 28; 1 KiB - 16 GiB: 25; 1 KiB - 4 GiB: 23; ABCI 4 B - 32 MiB: 24).
LAYOUTS = [
    (ECHO / "nccl_1.log", 1, 1, A100, 28), (ECHO / "nccl_2.log", 2, 1, A100, 28),
    (ECHO / "nccl_4.log", 4, 1, A100, 28), (ECHO / "nccl_8.log", 8, 1, A100, 28),
    (ECHO / "nccl_16.log", 16, 2, A100, 25), (ECHO / "nccl_32.log", 32, 4, A100, 23),
    (ECHO / "nccl_64.log", 64, 8, A100, 23), (ECHO / "nccl_128.log", 128, 16, A100, 23),
    (ABCI / "intra_vnode" / "job04.sh.7280532.nccl", 4, 1, V100, 24),
    (ABCI / "inter_vnode" / "job02.sh.7194532.nccl", 8, 2, V100, 24),
    (ABCI / "inter_vnode" / "job04.sh.7194533.nccl", 16, 4, V100, 24),
    (ABCI / "inter_vnode" / "job08.sh.7194534.nccl", 32, 8, V100, 24),
    (ABCI / "inter_vnode" / "job16.sh.7194535.nccl", 64, 16, V100, 24),
    (ABCI / "inter_vnode" / "job32.sh.7194536.nccl", 128, 32, V100, 24)]


def test_the_table_covers_every_nccl_tests_log():
    logs = {p for p in (REF / "nccl-tests").rglob("*") if p.is_file() and p.suffix in (".log", ".nccl")}
    assert logs == {row[0] for row in LAYOUTS}


@pytest.mark.parametrize("path, ranks, nodes, gpu, rows", LAYOUTS,
                         ids=lambda v: v.name if isinstance(v, Path) else None)
def test_layout_of_every_nccl_tests_log(path, ranks, nodes, gpu, rows):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImporterWarning)   # complete, uniform logs: nothing to warn about
        net = import_file("nccl-tests", path)
    (run,) = net.extra["nccl_tests"]
    assert (run["ranks"], run["nodes"], run["gpus_per_node"], run["gpu"]) == (ranks, nodes, ranks // nodes, gpu)
    assert len(run["hosts"]) == nodes and set(run["ranks_per_host"].values()) == {ranks // nodes}
    assert {(m.collective, m.ranks, m.nodes) for m in net.measurements} == {("allreduce", ranks, nodes)}
    assert len(net.measurements) == rows == len(run["busbw_GBps"]) and run["measurements"] == [0, rows]
    assert (run["format"], run["truncated"], run["types"]) == ("old", False, ["float"] * rows)
    assert all(len(m.time_s) == 2 for m in net.measurements)   # out-of-place and in-place both kept
    assert run["avg_busbw_GBps"] is not None and run["header"].startswith("nThread 1 nGpus ")


def test_echo_128_interleaved_tag_still_gives_16_nodes_of_8():
    run = import_file("nccl-tests", ECHO / "nccl_128.log").extra["nccl_tests"][0]
    assert "node-00000C" in run["hosts"] and len(run["hosts"]) == 16     # not node-[1,0]<stdout>:00000C
    assert run["ranks_per_host"]["node-00000C"] == 8


def test_cli_merges_every_nccl_tests_log_into_one_trace(tmp_path):
    paths = [str(row[0]) for row in LAYOUTS]
    out = tmp_path / "net.json.gz"
    r = subprocess.run([str(SIMFOG), "import", "nccl-tests", *paths, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert f"14 files -> {out}: NetworkTrace nccl/mixed: 350 measurements" in r.stdout
    net = load_network_trace(out)
    runs = net.extra["nccl_tests"]
    assert [(r["path"], r["ranks"], r["nodes"], r["gpus_per_node"], r["gpu"]) for r in runs] == [
        (str(p), n, k, n // k, g) for p, n, k, g, _ in LAYOUTS]
    ends = [0]
    for run, (_, ranks, nodes, _, rows) in zip(runs, LAYOUTS, strict=True):
        start, stop = run["measurements"]
        assert (start, stop - start) == (ends[-1], rows)
        ends.append(stop)
        assert {(m.ranks, m.nodes) for m in net.measurements[start:stop]} == {(ranks, nodes)}
    assert len(net.measurements) == ends[-1] == 350
    assert net.transport == "mixed" and net.provenance.source == "imported"
    assert all(f"[{i + 1}] {p}: " in net.provenance.notes for i, p in enumerate(paths))
    assert net.provenance.date.startswith("2021-06-")          # the earliest known date (ABCI's UCX stamps)
    # the same through the library, and three files with the command line
    assert import_files("nccl-tests", paths).to_dict() == net.to_dict()
    three = [str(ECHO / "nccl_8.log"), str(ECHO / "nccl_16.log"), str(ABCI / "inter_vnode" / "job02.sh.7194532.nccl")]
    r = subprocess.run([str(SIMFOG), "import", "nccl-tests", *three, "-o", str(tmp_path / "three.json.gz")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    net3 = load_network_trace(tmp_path / "three.json.gz")
    assert sorted({(m.ranks, m.nodes) for m in net3.measurements}) == [(8, 1), (8, 2), (16, 2)]
    assert [r["file"] for r in net3.extra["nccl_tests"]] == ["nccl_8.log", "nccl_16.log", "job02.sh.7194532.nccl"]


def test_collective_option_on_the_command_line(tmp_path):
    out = tmp_path / "x.json"
    r = subprocess.run([str(SIMFOG), "import", "nccl-tests", str(ECHO / "nccl_8.log"), "--collective", "all_reduce",
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_network_trace(out).extra["nccl_tests"][0]["collective_from"] == "given"
    r = subprocess.run([str(SIMFOG), "import", "mgwfbp", str(MG / "tmp8comm.log"), "--collective", "allreduce",
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("simfog: error: --collective = 'allreduce': only for importers")
    r = subprocess.run([str(SIMFOG), "import", "mgwfbp", str(MG / "tmp8comm.log"), str(MG / "tmp4comm.log"),
                        "-o", str(tmp_path / "y.json")], capture_output=True, text=True)  # x.json exists
    assert r.returncode == 2 and "one file: importer mgwfbp makes a model trace" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name, rows_kept, last", [("nccl_64.log", 11, 1 << 20), ("nccl_1.log", 20, 4 << 20)])
def test_a_real_log_cut_short_imports_with_a_warning(tmp_path, name, rows_kept, last):
    raw = (ECHO / name).read_bytes()
    cut = raw[: raw.index(b"%d " % (2 * last)) + 30]      # CRLF and MPI tags kept; ends inside the next row
    (tmp_path / name).write_bytes(cut)
    with pytest.warns(ImporterWarning, match=rf"truncated; the last size read is {last} B \({rows_kept} rows kept; "
                      rf"the incomplete last line '{2 * last} .*' was dropped\)"):
        net = import_file("nccl-tests", tmp_path / name)
    assert len(net.measurements) == rows_kept and net.measurements[-1].bytes == last
    assert net.extra["nccl_tests"][0]["truncated"]


def test_cli_osu_logs_at_several_process_counts(tmp_path):
    out = tmp_path / "x.json.gz"
    r = subprocess.run([str(SIMFOG), "import", "osu", *(str(MG / f"allreduce{n}.log") for n in (2, 4, 8)), "-o",
                        str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"simfog: warning: {MG / 'allreduce4.log'}: ranks = 4 taken from the file "
                                     "name (the log does not say); pass ranks=N if wrong"]
    net = load_network_trace(out)
    assert [(r["file"], r["ranks"], r["ranks_from"], r["measurements"]) for r in net.extra["osu"]] == [
        ("allreduce2.log", 2, "from the row prefix", [0, 266]),
        ("allreduce4.log", 4, "inferred from the file name", [266, 532]),
        ("allreduce8.log", 8, "from the row prefix", [532, 798])]
    at = {(m.ranks, m.bytes): round(m.time_s[0] * 1e6, 2) for m in net.measurements}
    assert [at[(n, 8192)] for n in (2, 4, 8)] == [67.49, 71.82, 182.03]       # mgwfbp-googlenet/PROVENANCE.md
    assert {(m.collective, m.nodes == m.ranks) for m in net.measurements} == {("allreduce", True)}


LOG_KINDS = ("nccl-tests", "osu", "imb")


def _every_ref_file():
    return sorted(p for p in REF.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", _every_ref_file(), ids=lambda p: str(p.relative_to(REF)))
def test_every_ref_file_imports_or_is_refused_with_a_config_error(path):
    """Each log importer either reads the file or refuses it with one ConfigError naming it; never another
    exception. Which file each kind reads is checked too."""
    name = path.relative_to(REF)
    readable = {"nccl-tests": path.suffix in (".log", ".nccl") and "nccl-tests" in path.parts,
                "osu": path.name.startswith("allreduce"), "imb": False}
    for kind in LOG_KINDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ImporterWarning)
            try:
                net = import_file(kind, path)
            except ConfigError as e:
                assert not readable[kind], f"{kind} refused {name}: {e}"
                assert e.source == str(path)
            else:
                assert readable[kind], f"{kind} read {name}"
                assert net.measurements
