"""`simfog import osu` on OSU Micro-Benchmarks and Intel MPI Benchmarks (IMB-MPI1) logs at several process counts.

The logs here are synthetic (made-up numbers), written with the tools' own printf formats: IMB from
intel/mpi-benchmarks src_c/IMB_output.c and IMB_g_info.c (ow_format = 13: `%13d%13d%13.2f%13.2f%13.2f` rows),
OSU from osu_util.h (`%-*d%*.*f`, FIELD_WIDTH 18, FLOAT_PRECISION 2). The real MG-WFBP OSU logs are in
test_import_ref.py."""

# ruff: noqa: UP031  (the logs are written with the tools' own printf formats, kept as they are in their C source)
from __future__ import annotations

import pytest

from simfog.errors import ConfigError
from simfog.importers import ImporterWarning, import_file, import_files

# ---- IMB ----

IMB_PREAMBLE = """\
#----------------------------------------------------------------
#    Intel(R) MPI Benchmarks 2021.7, MPI-1 part
#----------------------------------------------------------------
# Date                  : Tue Mar 14 09:26:41 2023
# Machine               : x86_64
# System                : Linux
# Release               : 5.14.0-162.6.1.el9_1.x86_64
# Version               : #1 SMP PREEMPT_DYNAMIC Fri Sep 30 07:36:03 EDT 2022
# MPI Version           : 3.1
# MPI Thread Environment:


# Calling sequence was:

# ./IMB-MPI1 -npmin 2 -msglog 0:4 PingPong Allreduce Allgather Barrier

# Minimum message length in bytes:   0
# Maximum message length in bytes:   16
#
# MPI_Datatype                   :   MPI_BYTE
# MPI_Datatype for reductions    :   MPI_FLOAT
# MPI_Op                         :   MPI_SUM
#
#

# List of Benchmarks to run:

# PingPong
# Allreduce
# Allgather
# Barrier
"""
IMB_FOOTER = "\n\n# All processes entering MPI_Finalize\n\n"
TOTAL = 8


def imb_t(bench: str, procs: int, nbytes: int) -> tuple[float, float, float]:
    """Made-up (t_min, t_max, t_avg) in µs."""
    avg = 1.0 + 0.5 * procs + nbytes / 1000 + (3.0 if bench == "Allgather" else 0.0)
    return round(avg * 0.9, 2), round(avg * 1.2, 2), round(avg, 2)


def imb_section(bench: str, procs: int, sizes, *, failed=(), group_mode=False) -> str:
    if bench == "Barrier":
        cols, line_len = ["#repetitions", "t_min[usec]", "t_max[usec]", "t_avg[usec]"], 4
    elif bench == "PingPong":
        cols, line_len = ["#bytes", "#repetitions", "t[usec]", "Mbytes/sec"], 4
    else:
        cols, line_len = ["#bytes", "#repetitions", "t_min[usec]", "t_max[usec]", "t_avg[usec]"], 5
    dashes = "#" + "-" * (line_len * 13 - 1)
    out = ["", dashes, f"# Benchmarking {'Multi-' if group_mode else ''}{bench} ", f"# #processes = {procs} "]
    if TOTAL - procs:
        out.append(f"# ( {TOTAL - procs} additional processes waiting in MPI_Barrier)")
    out += [dashes, "".join("%13s" % c for c in cols)]
    if bench == "Barrier":
        out.append("%13d%13.2f%13.2f%13.2f" % (1000, *imb_t(bench, procs, 0)))
        return "\n".join(out) + "\n"
    for size in sizes:
        if bench == "PingPong":
            t = imb_t(bench, procs, size)[2]
            out.append("%13d%13d%13.2f%13.2f" % (size, 1000, t, size / t))
        else:
            reps = 1000 if size < 1024 else 640
            out.append("%13d%13d%13.2f%13.2f%13.2f" % (size, reps, *imb_t(bench, procs, size)))
    for size in failed:
        out.append("%13d" % size + " time-out.; Time limit (secs_per_sample * msg_sizes_list_len) is over; use "
                   '"-time X" or SECS_PER_SAMPLE=X (IMB_settings.h) to increase time limit.')
    return "\n".join(out) + "\n"


RED = [0, 4, 8, 16]            # IMB skips 1 and 2 bytes for reductions (less than one MPI_FLOAT)
ALL = [0, 1, 2, 4, 8, 16]


def imb_log(*, truncate=False, failed=()) -> str:
    text = IMB_PREAMBLE + imb_section("PingPong", 2, ALL)
    for procs in (2, 4, 8):
        text += imb_section("Allreduce", procs, RED, failed=failed if procs == 8 else ())
        text += imb_section("Allgather", procs, ALL) + imb_section("Barrier", procs, [])
    if truncate:
        return text[: text.rindex("Allgather") + 420]     # inside the rows of the last Allgather section
    return text + IMB_FOOTER


def test_imb_allreduce_and_allgather_at_several_process_counts(tmp_path):
    path = tmp_path / "IMB-MPI1.log"
    path.write_text(imb_log())
    net = import_file("osu", path)                        # `simfog import osu` reads IMB logs too
    runs = net.extra["imb"]
    assert [(r["benchmark"], r["ranks"], r["measurements"]) for r in runs] == [
        ("Allreduce", 2, [0, 4]), ("Allgather", 2, [4, 10]), ("Allreduce", 4, [10, 14]), ("Allgather", 4, [14, 20]),
        ("Allreduce", 8, [20, 24]), ("Allgather", 8, [24, 30])]
    allreduce8 = net.measurements[20:24]
    assert [(m.collective, m.ranks, m.nodes, m.bytes) for m in allreduce8] == [
        ("allreduce", 8, 8, b) for b in RED]
    assert [m.time_s[0] * 1e6 for m in allreduce8] == pytest.approx([imb_t("Allreduce", 8, b)[2] for b in RED])
    # allgather: IMB's #bytes is one rank's part; simfog's bytes is the gathered output
    assert [m.bytes for m in net.measurements[24:30]] == [8 * b for b in ALL]
    assert runs[4]["t_max_us"] == [imb_t("Allreduce", 8, b)[1] for b in RED]
    assert runs[0]["version"] == "2021.7" and net.provenance.date == "2023-03-14T09:26:41"
    assert "Left out (not a collective simfog models, or no rows): Barrier, PingPong" in net.provenance.notes
    assert "one process per node" in net.provenance.notes and net.backend == "mpi"
    only = import_file("osu", path, collective="allreduce", nodes=2)
    assert {(m.collective, m.nodes) for m in only.measurements} == {("allreduce", 2)}
    tmax = import_file("imb", path, statistic="max")
    assert tmax.measurements[20].time_s[0] * 1e6 == pytest.approx(imb_t("Allreduce", 8, 0)[1])


def test_imb_truncated_log_and_sizes_imb_gave_up_on(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text(imb_log(truncate=True))
    with pytest.warns(ImporterWarning, match=r"the log is truncated; the last size read in 'Allgather' "
                      r"\(#processes = 8\) is 2 B; the incomplete last line '4 1000 7.20 9.60' was dropped"):
        net = import_file("osu", path)
    assert net.extra["imb"][-1]["truncated"] and net.measurements[-1].bytes == 2 * 8
    assert not any(r["truncated"] for r in net.extra["imb"][:-1])
    path.write_text(imb_log(failed=[4194304]))
    with pytest.warns(ImporterWarning, match="Allreduce' at line .*1 size.s. IMB did not measure"):
        net = import_file("osu", path)
    assert net.extra["imb"][4]["failed_rows"][0].startswith("4194304 time-out")


BAD_LINE = imb_log().split("\n").index("%13d%13d%13.2f%13.2f%13.2f" % (4, 1000, *imb_t("Allreduce", 4, 4))) + 1
BAD_ROW = "\n".join(line if i != BAD_LINE else line[:-13] + "%13s" % "x.yz"
                    for i, line in enumerate(imb_log().split("\n"), 1))


@pytest.mark.parametrize("text, options, field, match", [
    (IMB_PREAMBLE + imb_section("Allreduce", 2, RED, group_mode=True), {}, "benchmark", "without -multi"),
    (IMB_PREAMBLE + imb_section("PingPong", 2, ALL) + IMB_FOOTER, {}, "benchmark", "importable: Allreduce"),
    (imb_log(), {"collective": "broadcast"}, "benchmark", "no broadcast section"),
    (imb_log(), {"ranks": 4}, "ranks", "2, the '#processes' of section 'Allreduce'"),
    (imb_log(), {"nodes": 3}, "nodes", "at most the 2 processes"),
    (BAD_ROW, {}, f"line {BAD_LINE}", "a row of 5 numbers"),
])
def test_imb_bad_input(tmp_path, text, options, field, match):
    path = tmp_path / "imb.log"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        import_file("osu", path, **options)
    assert (e.value.source, e.value.field) == (str(path), field)


# ---- OSU ----

def osu_run(procs: int, sizes, *, version="v7.3", full=False) -> str:
    """One osu_allreduce run: made-up latency 2 + procs + bytes/2000 µs."""
    out = [f"# OSU MPI Allreduce Latency Test {version}"]
    if version.startswith("v7"):
        out.append("# Datatype: MPI_CHAR.")
    out.append("# Size       Avg Latency(us)" + ("   Min Latency(us)   Max Latency(us)  Iterations" if full else ""))
    for size in sizes:
        avg = 2 + procs + size / 2000
        row = "%-*d%*.*f" % (10, size, 18, 2, avg)
        if full:
            row += "%*.*f%*.*f%*d" % (18, 2, avg * 0.9, 18, 2, avg * 1.1, 12, 1000)
        out.append(row)
    return "\n".join(out) + "\n"


SIZES = [1, 2, 4, 1024, 1 << 20]


def test_osu_several_runs_in_one_file_with_launcher_lines(tmp_path):
    text = "".join(f"$ mpirun -np {n} --map-by ppr:1:node ./osu_allreduce -m 1:1048576{' -f' if n == 4 else ''}\n"
                   + osu_run(n, SIZES, full=n == 4) + "\n" for n in (2, 4, 16))
    path = tmp_path / "sweep.log"
    path.write_bytes(("\r\n".join("[1,0]<stdout>:" + line for line in text.split("\n"))).encode())
    net = import_file("osu", path)
    runs = net.extra["osu"]
    assert [(r["ranks"], r["ranks_from"], r["measurements"]) for r in runs] == [
        (2, "from the launcher line before the run", [0, 5]), (4, "from the launcher line before the run", [5, 10]),
        (16, "from the launcher line before the run", [10, 15])]
    assert [m.time_s[0] * 1e6 for m in net.measurements[10:]] == pytest.approx([18 + s / 2000 for s in SIZES],
                                                                                abs=0.006)
    given = import_file("osu", path, ranks="2,4,8", nodes=2)
    assert [r["ranks"] for r in given.extra["osu"]] == [2, 4, 8] and given.measurements[0].nodes == 2
    with pytest.raises(ConfigError, match="one per run in the file .3 runs."):
        import_file("osu", path, ranks="2,4")


def test_osu_one_file_per_process_count_merge(tmp_path):
    paths = []
    for n in (2, 4, 8):
        paths.append(tmp_path / f"osu_allreduce_np{n}.txt")
        paths[-1].write_text(osu_run(n, SIZES, version="v5.6.3"))
    with pytest.warns(ImporterWarning, match="taken from the file name"):
        net = import_files("osu", paths)
    assert [(r["file"], r["ranks"]) for r in net.extra["osu"]] == [
        ("osu_allreduce_np2.txt", 2), ("osu_allreduce_np4.txt", 4), ("osu_allreduce_np8.txt", 8)]
    assert sorted({m.ranks for m in net.measurements}) == [2, 4, 8] and len(net.measurements) == 15


def test_osu_allgather_sizes_become_the_gathered_output(tmp_path):
    path = tmp_path / "ag.log"
    path.write_text(osu_run(4, SIZES).replace("Allreduce", "Allgather"))
    net = import_file("osu", path, ranks=4)
    assert [m.bytes for m in net.measurements] == [4 * s for s in SIZES]
    with pytest.raises(ConfigError, match="one of the collectives in the log: allgather"):
        import_file("osu", path, ranks=4, collective="allreduce")
    with pytest.raises(ConfigError, match="one of allreduce, allgather"):
        import_file("osu", path, ranks=4, collective="gatherv")
