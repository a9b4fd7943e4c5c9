"""Intel MPI Benchmarks (IMB-MPI1) collective logs -> NetworkTrace. `simfog import osu` hands IMB logs here.

The layout (intel/mpi-benchmarks src_c/IMB_output.c, IMB_print_header / IMB_show_procids / IMB_display_times):

    #----------------------------------------------------------------
    # Benchmarking Allreduce
    # #processes = 4
    # ( 4 additional processes waiting in MPI_Barrier)
    #----------------------------------------------------------------
           #bytes #repetitions  t_min[usec]  t_max[usec]  t_avg[usec]
                0         1000         0.03         0.04         0.03
                4         1000         1.52         1.60         1.56

One section per benchmark and process count (`-npmin` runs every count from npmin up to the job's size), so one
file holds several runs. The file ends with `# All processes entering MPI_Finalize`; without it the log is
truncated. `#bytes` is IMB's message size: the buffer for Allreduce, Reduce, Bcast and Reduce_scatter (which
scatters it), one rank's contribution for Allgather and one block per peer for Alltoall (src_c/IMB_allgather.c,
IMB_alltoall.c); simfog's `bytes` is the gathered output and the whole per-rank buffer for those two (nccl-tests'
convention), so their sizes are multiplied by the process count.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.importers.logs import clean_lines, collective_option, is_number, ranks_option, warn
from simfog.trace import Measurement, NetworkTrace, Provenance

EXPECTED = ("an Intel MPI Benchmarks log ('# Benchmarking <Name>' and '# #processes = N' sections, then rows "
            "'#bytes #repetitions t_min[usec] t_max[usec] t_avg[usec]')")
_BENCH = re.compile(r"#\s*Benchmarking\s+(Multi-)?(\S+)")
_PROCS = re.compile(r"#\s*#processes\s*=\s*(\d+)")
_VERSION = re.compile(r"#\s*Intel\s*(?:\(R\))?\s*MPI Benchmarks\s+(\S+?),?\s")
_DATE = re.compile(r"#\s*Date\s*:\s*(.*\S)")
_FINALIZE = re.compile(r"#\s*All processes entering MPI_Finalize")
# IMB benchmark name (lower case) -> (simfog collective, bytes multiplied by the process count?)
_NAMES = {"allreduce": ("allreduce", False), "reduce": ("reduce", False), "bcast": ("broadcast", False),
          "reduce_scatter": ("reduce_scatter", False), "allgather": ("allgather", True),
          "alltoall": ("alltoall", True)}
STATISTICS = ("avg", "max", "min")


def is_imb(text: str) -> bool:
    return bool(re.search(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:)?#\s*Benchmarking\s", text, re.MULTILINE))


def _date(text: str) -> str:
    """'Thu Mar  3 10:00:00 2022' -> '2022-03-03T10:00:00' (IMB prints the local time, zone not recorded)."""
    try:
        return datetime.datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        return "unknown"


def import_imb(path, *, ranks: int | str | None = None, nodes: int | None = None, transport: str = "unknown",
               backend: str = "mpi", collective: str | None = None, statistic: str = "avg") -> NetworkTrace:
    """Intel MPI Benchmarks (IMB-MPI1) log -> NetworkTrace: collectives at one or several process counts.

    Reads the Allreduce, Reduce, Bcast, Reduce_scatter, Allgather and Alltoall sections, one measurement
    (time_s = [t_avg], or t_max / t_min with `statistic`) per row.

    ranks = the section's `#processes` (a given `ranks` must agree); nodes = `nodes` if given, else ranks (one
    process per node, an assumption: IMB does not print host names). `collective` keeps only that collective's
    sections. Other benchmarks (PingPong, Barrier, ...) are left out and listed in the notes. Raises ConfigError
    naming the file for a log of another tool or bad options; warns (ImporterWarning) when the log is truncated.
    """
    path = str(path)
    name = Path(path).name
    if statistic not in STATISTICS:
        raise ConfigError("statistic", statistic, f"one of {', '.join(STATISTICS)}", source=path)
    wanted = collective_option(collective, path)
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise ConfigError("nodes", nodes, "an integer >= 1", source=path)
    text = files.read_text(path)
    lines = clean_lines(text)
    version = next((m.group(1) for m in map(_VERSION.match, lines) if m), None)
    date = next((_date(m.group(1)) for m in map(_DATE.match, lines) if m), "unknown")
    sections: list[dict] = []
    current: dict | None = None
    last_line = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    partial = None
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        if m := _BENCH.match(line):
            if m.group(1):
                raise ConfigError("benchmark", f"Multi-{m.group(2)}", "a run without -multi (one group of "
                                  "processes: 'Benchmarking <Name>')", source=path)
            current = {"benchmark": m.group(2), "procs": None, "columns": None, "rows": [], "failed": [],
                       "line": number}
            sections.append(current)
        elif (m := _PROCS.match(line)) and current is not None:
            current["procs"] = int(m.group(1))
        elif line.startswith("#bytes") or line.startswith("#repetitions"):
            if current is not None:
                current["columns"] = line.split()
        elif line[0].isdigit() and current is not None and current["columns"]:
            cols, tok = current["columns"], line.split()
            if current["benchmark"].lower() not in _NAMES:
                continue  # PingPong, Barrier & co.: not a collective simfog models (listed in the notes)
            if len(tok) >= 2 and not is_number(tok[1]):  # "4194304 time-out.; ..." / "out-of-mem.": IMB gave up
                current["failed"].append(line[:80])
                continue
            if len(tok) != len(cols) or not all(map(is_number, tok)):
                if number == last_line:  # the log ends inside this row
                    partial = " ".join(line.split())
                    continue
                raise ConfigError(f"line {number}", line[:60], f"{EXPECTED}: a row of {len(cols)} numbers "
                                  f"({' '.join(cols)})", source=path)
            values = dict(zip(cols, map(float, tok), strict=True))
            if not {"t_min[usec]", "t_max[usec]", "t_avg[usec]"} <= values.keys():
                raise ConfigError(f"line {number}", " ".join(cols), EXPECTED, source=path)
            current["rows"].append(values)
    if not sections:
        raise ConfigError("format", "(no '# Benchmarking' section)", EXPECTED, source=path)
    usable = [s for s in sections if s["benchmark"].lower() in _NAMES and s["rows"]]
    if wanted is not None:
        usable = [s for s in usable if _NAMES[s["benchmark"].lower()][0] == wanted]
    if not usable:
        present = sorted({s["benchmark"] for s in sections})
        what = f"no {wanted} section" if wanted else "no section of a collective simfog models"
        raise ConfigError("benchmark", ", ".join(present), f"{EXPECTED}: {what} with rows (importable: "
                          "Allreduce, Reduce, Bcast, Reduce_scatter, Allgather, Alltoall)", source=path)
    per_run = ranks_option(ranks, len(usable), path)
    key = {"avg": "t_avg[usec]", "max": "t_max[usec]", "min": "t_min[usec]"}[statistic]
    truncated = not any(_FINALIZE.match(line.strip()) for line in lines)
    measurements: list[Measurement] = []
    runs: list[dict] = []
    for section, given in zip(usable, per_run, strict=True):
        procs = section["procs"]
        where = f"section '{section['benchmark']}' at line {section['line']}"
        if procs is None:
            if given is None:
                raise ConfigError("#processes", f"(missing in {where})", "pass ranks=N", source=path)
            procs = given
        elif given is not None and given != procs:
            raise ConfigError("ranks", given, f"{procs}, the '#processes' of {where}", source=path)
        if nodes is not None and nodes > procs:
            raise ConfigError("nodes", nodes, f"at most the {procs} processes of {where}", source=path)
        run_nodes = procs if nodes is None else nodes
        coll, scaled = _NAMES[section["benchmark"].lower()]
        scale = procs if scaled else 1
        first = len(measurements)
        measurements += [Measurement(coll, procs, run_nodes, int(r["#bytes"]) * scale, (r[key] * 1e-6,))
                         for r in section["rows"]]
        if section["failed"]:
            warn(path, f"{where}: {len(section['failed'])} size(s) IMB did not measure were left out "
                 f"({section['failed'][0]!r} ...)")
        runs.append({"file": name, "tool": "IMB", "version": version, "benchmark": section["benchmark"],
                     "collective": coll, "ranks": procs, "nodes": run_nodes,
                     "nodes_from": "given" if nodes is not None else "assumed: one process per node",
                     "bytes_per_imb_bytes": scale, "statistic": statistic,
                     "measurements": [first, len(measurements)],
                     "t_min_us": [r["t_min[usec]"] for r in section["rows"]],
                     "t_max_us": [r["t_max[usec]"] for r in section["rows"]],
                     "repetitions": [int(r.get("#repetitions", 0)) for r in section["rows"]],
                     "failed_rows": section["failed"], "truncated": truncated and section is sections[-1]})
    if truncated:
        last = sections[-1]
        size = f"{int(last['rows'][-1]['#bytes'])} B" if last["rows"] else "none"
        warn(path, f"no '# All processes entering MPI_Finalize' line: the log is truncated; the last size read in "
             f"'{last['benchmark']}' (#processes = {last['procs']}) is {size}"
             + (f"; the incomplete last line {partial[:40]!r} was dropped" if partial else ""))
    skipped = sorted({s["benchmark"] for s in sections} - {s["benchmark"] for s in usable})
    counts = ", ".join(f"{r['benchmark']} x {r['ranks']}" for r in runs)
    notes = (f"Imported by `simfog import osu {name}` (an Intel MPI Benchmarks {version or ''} log). time_s = "
             f"[t_{statistic}] over the section's repetitions, in seconds (t_min and t_max across ranks are in "
             f"extra.imb). Runs (benchmark x processes): {counts}. ranks = each section's '#processes'; nodes = "
             + (f"{nodes} (given)" if nodes is not None else "ranks (inferred: one process per node; IMB does not "
                "print host names)")
             + ". Allgather and Alltoall sizes are IMB's #bytes times the process count (simfog's bytes: the "
             "gathered output, the whole per-rank buffer)."
             + (f" Left out (not a collective simfog models, or no rows): {', '.join(skipped)}." if skipped else "")
             + (" TRUNCATED: no MPI_Finalize line." if truncated else "")
             + (" Date: the log's local time (zone not recorded)." if date != "unknown" else ""))
    return NetworkTrace(
        backend=backend, transport=transport,
        provenance=Provenance(command=f"simfog import osu {name}", date=date, host="unknown", source="imported",
                              estimated=False, notes=notes),
        measurements=tuple(measurements), extra={"imb": runs})
