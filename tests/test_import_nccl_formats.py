"""nccl-tests importer on synthetic logs of the three output formats (tests/nccl_log_writer.py writes them with
nccl-tests' own printf formats; the numbers are made up): every collective, float and double, sizes of 0, MPI
output tags, CRLF, several tests per file, per-iteration columns, time stamps, truncated logs, bad input."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from simfog.errors import ConfigError
from simfog.importers import ImporterWarning, import_file, import_files
from simfog.trace import COLLECTIVES, load_network_trace

from .nccl_log_writer import BUS_FACTOR, PROGRAM, log_text, run_lines, time_us

SIZES = [0, 8, 1024, 65536, 1 << 20, 1 << 27]
FORMATS = ("old", "middle", "middle-empty-redop", "new")
# Logs that do not name the test, where neither the layout nor busbw/algbw tells these apart: old format, both
# with a redop column and (n-1)/n; middle format, both without redop and root and (n-1)/n.
AMBIGUOUS = {"old": {"reduce_scatter": "reduce_scatter, alltoall", "alltoall": "reduce_scatter, alltoall"},
             "middle": {"allgather": "allgather, alltoall", "alltoall": "allgather, alltoall"}}
AMBIGUOUS["middle-empty-redop"] = AMBIGUOUS["middle"]

# A literal middle-format (nccl-tests 2.13-era) all_reduce_perf log, 2 nodes x 2 GPUs; written by hand from the
# printf formats of NVIDIA/nccl-tests d313d20 src/common.cu (synthetic numbers; busbw = algbw * 2(n-1)/n = 1.5).
MIDDLE_LITERAL = "\n".join([
    "# nThread 1 nGpus 1 minBytes 0 maxBytes 4194304 step: 1024(factor) warmup iters: 5 iters: 20 agg iters: 1 "
    "validation: 1 graph: 0",
    "#",
    "# Using devices",
    "#  Rank  0 Group  0 Pid  41001 on    gpu-a01 device  0 [0x07] NVIDIA H100 80GB HBM3",
    "#  Rank  1 Group  0 Pid  41002 on    gpu-a01 device  1 [0x0f] NVIDIA H100 80GB HBM3",
    "#  Rank  2 Group  0 Pid  52001 on    gpu-a02 device  0 [0x07] NVIDIA H100 80GB HBM3",
    "#  Rank  3 Group  0 Pid  52002 on    gpu-a02 device  1 [0x0f] NVIDIA H100 80GB HBM3",
    "#",
    "#                                                              out-of-place                       in-place",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       "
    "     (us)  (GB/s)  (GB/s)",
    "           0             0     float     sum      -1     0.25    0.00    0.00      0"
    "     0.24    0.00    0.00      0",
    "        4096          1024     float     sum      -1    20.00    0.20    0.31      0"
    "    19.50    0.21    0.32      0",
    "     4194304       1048576     float     sum      -1    262.1   16.00   24.00      0"
    "    260.0   16.13   24.20      0",
    "# Out of bounds values : 0 OK",
    "# Avg bus bandwidth    : 8.10333 ",
    "#",
    "",
    "",
])


def us(net, nbytes, collective=None):
    m = next(x for x in net.measurements if x.bytes == nbytes and collective in (None, x.collective))
    return [round(t * 1e6, 4) for t in m.time_s]


def write(tmp_path, text, name="x.log"):
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def check_run(net, run, collective, ranks, nodes, sizes, dtype="float"):
    """Measurements of `run` (an extra["nccl_tests"] entry) against the made-up times and the logged busbw."""
    start, stop = run["measurements"]
    ms = net.measurements[start:stop]
    assert [m.bytes for m in ms] == sizes and run["types"] == [dtype] * len(sizes)
    assert {(m.collective, m.ranks, m.nodes) for m in ms} == {(collective, ranks, nodes)}
    for m, busbw in zip(ms, run["busbw_GBps"], strict=True):
        for t, in_place in zip(m.time_s, (False, True), strict=True):
            assert t * 1e6 == pytest.approx(time_us(collective, m.bytes, ranks, in_place), rel=5e-4, abs=6e-3)
        if m.bytes >= 1 << 20:   # busbw column = size/time * factor: the columns were read in the right places
            assert busbw[0] == pytest.approx(m.bytes / m.time_s[0] / 1e9 * BUS_FACTOR[collective](ranks), rel=2e-3)


# Every format with every collective it prints: only collectives without a redop print it empty.
FORMAT_CASES = [(fmt, c) for fmt in FORMATS for c in COLLECTIVES
                if fmt != "middle-empty-redop" or c in ("allgather", "broadcast", "alltoall")]


@pytest.mark.parametrize("fmt, collective", FORMAT_CASES, ids=[f"{f}-{c}" for f, c in FORMAT_CASES])
def test_every_format_and_collective(tmp_path, fmt, collective):
    path = write(tmp_path, log_text(run_lines(fmt, collective, sizes=SIZES, hosts=("n01", "n02"), gpus_per_node=4)))
    if collective in AMBIGUOUS.get(fmt, {}):
        with pytest.raises(ConfigError, match=f"--collective NAME.*fits {AMBIGUOUS[fmt][collective]}") as e:
            import_file("nccl-tests", path)
        assert e.value.source == str(path) and e.value.field == "collective"
        net = import_file("nccl-tests", path, collective=collective)
    else:
        net = import_file("nccl-tests", path)
    (run,) = net.extra["nccl_tests"]
    check_run(net, run, collective, 8, 2, SIZES)
    assert (run["format"], run["collective"]) == ("old" if fmt == "old" else fmt[:6].rstrip("-"), collective)
    assert (run["hosts"], run["gpus_per_node"], run["gpu"]) == (["n01", "n02"], 4, "NVIDIA A100-SXM4-80GB")
    how = run["collective_from"]
    assert how.startswith("named in the log" if fmt == "new" else ("given", "assumed", "inferred"))
    assert net.measurements[0].bytes == 0                 # a size of 0 is a row like any other


@pytest.mark.parametrize("fmt", FORMATS[:2] + FORMATS[3:])
def test_double_precision_rows(tmp_path, fmt):
    path = write(tmp_path, log_text(run_lines(fmt, "allreduce", sizes=SIZES[1:], dtype="double")))
    net = import_file("nccl-tests", path)
    check_run(net, net.extra["nccl_tests"][0], "allreduce", 8, 1, SIZES[1:], dtype="double")
    assert net.transport == "nvlink"                       # one node of SXM GPUs


@pytest.mark.parametrize("tags", [False, True])
@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("fmt", ["old", "new"])
def test_mpi_tags_and_crlf(tmp_path, fmt, tags, crlf):
    ucx = [f"[1622510346.87695{i}] [n01:4000{i}:0]    ucp_context.c:1437 UCX  WARN  UCP version is incompatible"
           for i in range(2)]
    text = log_text(run_lines(fmt, "allreduce", sizes=SIZES, hosts=("n01", "n02", "n03"), gpus_per_node=2),
                    tags=tags, crlf=crlf, preamble=ucx)
    path = write(tmp_path, text)
    assert (b"\r\n" in path.read_bytes()) == crlf
    net = import_file("nccl-tests", path)
    (run,) = net.extra["nccl_tests"]
    check_run(net, run, "allreduce", 6, 3, SIZES)
    assert run["hosts"] == ["n01", "n02", "n03"] and run["gpus_per_node"] == 2
    assert net.provenance.date == "2021-06-01T01:19:06Z"    # the first UCX time stamp


def test_the_literal_middle_format_log(tmp_path):
    net = import_file("nccl-tests", write(tmp_path, MIDDLE_LITERAL.replace("\n", "\r\n")))
    assert [(m.bytes, m.ranks, m.nodes) for m in net.measurements] == [(0, 4, 2), (4096, 4, 2), (4194304, 4, 2)]
    assert us(net, 0) == [0.25, 0.24] and us(net, 4194304) == [262.1, 260.0]
    (run,) = net.extra["nccl_tests"]
    assert (run["format"], run["gpus_per_node"], run["gpu"], run["avg_busbw_GBps"]) == (
        "middle", 2, "NVIDIA H100 80GB HBM3", 8.10333)
    assert run["busbw_GBps"][2] == [24.0, 24.2] and run["redops"] == ["sum"] * 3
    assert "= 2(n-1)/n confirms it" in run["collective_from"]


def test_several_tests_per_file_each_with_its_collective(tmp_path):
    """New format, the seven collectives one after the other in one file (a script running each *_perf binary,
    or one binary run with several), NCCL_DEBUG lines between them, and a test simfog does not model."""
    info = "gpu-a01:41001:41001 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>"
    runs = [run_lines("new", c, sizes=SIZES, hosts=("gpu-a01", "gpu-a02"), gpus_per_node=4, nccl_info=info,
                      dtype="double" if c == "reduce" else "float") for c in COLLECTIVES]
    gather = run_lines("new", "allgather", sizes=SIZES, hosts=("gpu-a01", "gpu-a02"), gpus_per_node=4)
    gather = [line.replace("all_gather_perf", "gather_perf") for line in gather]
    path = write(tmp_path, log_text(*runs[:3], gather, *runs[3:], tags=True))
    with pytest.warns(ImporterWarning, match="test 4 .gather_perf. is skipped"):
        net = import_file("nccl-tests", path)
    got = net.extra["nccl_tests"]
    assert [r["collective"] for r in got] == list(COLLECTIVES)
    assert [r["program"] for r in got] == [PROGRAM[c] for c in COLLECTIVES]
    assert [r["test"] for r in got] == [1, 2, 3, 5, 6, 7, 8]
    for run, c in zip(got, COLLECTIVES, strict=True):
        check_run(net, run, c, 8, 2, SIZES, dtype="double" if c == "reduce" else "float")
        assert (run["format"], run["nccl_tests_version"], run["nccl_version"]) == ("new", "2.19.6", "2.29.3")
        assert run["transport"] == "ib" and not run["truncated"]
    assert len(net.measurements) == 7 * len(SIZES) and net.transport == "ib"
    with pytest.warns(ImporterWarning, match="gather_perf"):
        only = import_file("nccl-tests", path, collective="reduce-scatter")
    assert {m.collective for m in only.measurements} == {"reduce_scatter"} and len(only.measurements) == len(SIZES)
    with pytest.raises(ConfigError, match="one of the collectives in the log: allreduce, allgather"):
        import_file("nccl-tests", write(tmp_path, log_text(*runs[:2]), "two.log"), collective="broadcast")


def test_per_iteration_columns_and_time_stamps(tmp_path):
    text = log_text(run_lines("new", "reduce", sizes=SIZES, per_iter=True),
                    run_lines("new", "broadcast", sizes=SIZES, stamps=True, validation=False))
    net = import_file("nccl-tests", write(tmp_path, text))
    reduce, bcast = net.extra["nccl_tests"]
    check_run(net, reduce, "reduce", 8, 1, SIZES)
    check_run(net, bcast, "broadcast", 8, 1, SIZES)


@pytest.mark.parametrize("fmt", ["old", "middle", "new"])
def test_a_truncated_log_imports_with_a_warning_naming_the_last_size(tmp_path, fmt):
    text = log_text(run_lines(fmt, "allreduce", sizes=SIZES, hosts=("n01", "n02"), gpus_per_node=4, cut_after=4),
                    tags=fmt == "middle", crlf=fmt == "old")
    with pytest.warns(ImporterWarning, match=r"no '# Avg bus bandwidth' footer: the log is truncated; the last size "
                      r"read is 65536 B \(4 rows kept; the incomplete last line '1048576 .*' was dropped\)"):
        net = import_file("nccl-tests", write(tmp_path, text))
    (run,) = net.extra["nccl_tests"]
    assert (run["truncated"], run["last_bytes"], len(net.measurements)) == (True, 65536, 4)
    assert "TRUNCATED" in net.provenance.notes
    check_run(net, run, "allreduce", 8, 2, SIZES[:4])


def test_truncated_in_a_multi_test_file_and_complete_logs_do_not_warn(tmp_path):
    first = run_lines("new", "allgather", sizes=SIZES, cut_after=2)
    text = log_text(first, run_lines("new", "allreduce", sizes=SIZES))
    with pytest.warns(ImporterWarning, match=r"all_gather_perf, test 1 of 2 has no .*last size read is 8 B"):
        net = import_file("nccl-tests", write(tmp_path, text))
    assert [r["truncated"] for r in net.extra["nccl_tests"]] == [True, False]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_file("nccl-tests", write(tmp_path, log_text(run_lines("new", "allreduce", sizes=SIZES)), "ok.log"))


def test_failed_validation_warns(tmp_path):
    text = log_text(run_lines("middle", "allreduce", sizes=SIZES)).replace("values : 0 OK", "values : 3 FAILED")
    with pytest.warns(ImporterWarning, match="'Out of bounds values : 3 FAILED': nccl-tests found wrong results"):
        net = import_file("nccl-tests", write(tmp_path, text))
    assert net.extra["nccl_tests"][0]["out_of_bounds"] == 3


def test_uneven_ranks_per_node_warn_and_leave_gpus_per_node_unset(tmp_path):
    text = log_text(run_lines("middle", "allreduce", sizes=SIZES, hosts=("a", "b"), ranks_per_host=(4, 2)))
    with pytest.warns(ImporterWarning, match="ranks per node differ .a 4, b 2."):
        net = import_file("nccl-tests", write(tmp_path, text))
    (run,) = net.extra["nccl_tests"]
    assert (run["ranks"], run["nodes"], run["gpus_per_node"], run["ranks_per_host"]) == (6, 2, None, {"a": 4, "b": 2})


def test_several_files_merge_into_one_trace(tmp_path):
    a = write(tmp_path, log_text(run_lines("old", "allreduce", sizes=SIZES, gpus_per_node=4)), "a.log")
    b = write(tmp_path, log_text(run_lines("new", "allgather", sizes=SIZES, hosts=("x", "y"), gpus_per_node=4),
                                 run_lines("new", "allreduce", sizes=SIZES, hosts=("x", "y"), gpus_per_node=4)),
              "b.log")
    net = import_files("nccl-tests", [a, b])
    runs = net.extra["nccl_tests"]
    assert [(r["file"], r["test"], r["collective"], r["measurements"]) for r in runs] == [
        ("a.log", 1, "allreduce", [0, 6]), ("b.log", 1, "allgather", [6, 12]), ("b.log", 2, "allreduce", [12, 18])]
    assert [r["path"] for r in runs] == [str(a), str(b), str(b)]
    for run in runs:
        check_run(net, run, run["collective"], run["ranks"], run["nodes"], SIZES)
    assert net.transport == "mixed"                       # nvlink (one node) and unknown (two nodes)
    assert net.provenance.command == f"simfog import nccl-tests {a} {b}"
    assert f"[1] {a}: " in net.provenance.notes and f"[2] {b}: " in net.provenance.notes
    with pytest.raises(ConfigError, match="each file once"):
        import_files("nccl-tests", [a, b, a])
    with pytest.raises(ConfigError, match="one file: importer mgwfbp makes a model trace"):
        import_files("mgwfbp", [a, b])


@pytest.mark.parametrize("text, options, field, match", [
    ("no header here\n1 2 3\n", {}, "format", "nccl-tests log"),
    ("# OSU MPI Allreduce Latency Test v5.4.0\n4 1.0\n", {}, "format", "use kind 'osu'"),
    (log_text(run_lines("new", "allreduce", sizes=SIZES))[:700], {}, "rows", "no data rows"),
    (log_text(run_lines("old", "allreduce", sizes=SIZES)), {"collective": "allgatherv"}, "collective",
     "one of allreduce, allgather"),
    (log_text(run_lines("old", "allreduce", sizes=SIZES)), {"times": "median"}, "times", "both, out-of-place"),
    (log_text(run_lines("old", "allreduce", sizes=SIZES)), {"ranks": "0"}, "ranks", "integer >= 1"),
    (log_text(run_lines("old", "allreduce", sizes=SIZES)), {"ranks": "2,4"}, "ranks",
     r"one per run in the file .1 run."),
    (log_text(run_lines("new", "allreduce", sizes=SIZES)).replace("all_reduce_perf", "scatter_perf"), {},
     "collective", "simfog does not model"),
])
def test_bad_input_is_one_config_error_naming_file_field_and_allowed(tmp_path, text, options, field, match):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as e:
        import_file("nccl-tests", path, **options)
    assert (e.value.source, e.value.field) == (str(path), field)


def test_cli_bad_input_prints_one_line_without_traceback(tmp_path):
    simfog = Path(sys.executable).with_name("simfog")
    bad = write(tmp_path, "garbage\n")
    good = write(tmp_path, log_text(run_lines("new", "allreduce", sizes=SIZES)), "good.log")
    r = subprocess.run([str(simfog), "import", "nccl-tests", str(good), str(bad), "-o", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"simfog: error: {bad}: format = \"(no '# nThread' header)\": "
                                             "an nccl-tests log (e.g. all_reduce_perf output: a '# nThread ...' "
                                             "header, '# Using devices' rank lines and rows 'size count type redop "
                                             "time algbw busbw ...')"]
    assert not (tmp_path / "o.json").exists()
    cut = write(tmp_path, log_text(run_lines("new", "allreduce", sizes=SIZES, cut_after=3)), "cut.log")
    r = subprocess.run([str(simfog), "import", "nccl-tests", str(good), str(cut), "-o", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"simfog: warning: {cut}: all_reduce_perf has no '# Avg bus bandwidth' "
                                     "footer: the log is truncated; the last size read is 1024 B (3 rows kept; the "
                                     "incomplete last line '65536 16384 float sum -1 10.' was dropped)"]
    assert len(load_network_trace(tmp_path / "o.json").measurements) == len(SIZES) + 3
