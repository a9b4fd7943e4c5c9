"""OSU Micro-Benchmarks collective latency logs (osu_allreduce & co.) -> NetworkTrace; Intel MPI Benchmarks logs
are recognised and read by simfog.importers.imb.

Rows are `<bytes> <avg latency us> [min max iterations ...]` under a `# OSU MPI <Collective> Latency Test vX`
header. One file may hold one run or several runs one after the other (a header each), e.g. a loop over process
counts. OSU does not print the process count; per run it comes from, in this order: the `ranks` option, a
`<nprocs>,` prefix on the rows (the MG-WFBP authors' published OSU logs have it in some files and not in
others), the last launcher line before the run (`mpirun -np 4 ...`, `srun -n 4 ...`, or a `# np = 4` comment), and
for a file of one run the number in its name (`allreduce4.log`; with an ImporterWarning, since that is a guess).

`Size` is OSU's message size: the buffer for allreduce, reduce, bcast and reduce_scatter, one rank's contribution
for allgather and one block per peer for alltoall; simfog's `bytes` is the gathered output and the whole per-rank
buffer for those two (nccl-tests' convention), so their sizes are multiplied by the process count.
"""

from __future__ import annotations

import re
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.importers.imb import import_imb, is_imb
from simfog.importers.logs import clean_lines, collective_option, launcher_ranks, number_in_name, ranks_option, warn
from simfog.trace import Measurement, NetworkTrace, Provenance

EXPECTED = ("an OSU Micro-Benchmarks latency log ('# OSU MPI <Collective> Latency Test' header, then rows "
            "'[<nprocs>,]<bytes> <avg latency us>') or an Intel MPI Benchmarks log ('# Benchmarking Allreduce')")
_HEADER = re.compile(r"#\s*OSU\s+(?:MPI\S*\s+)?(.*?)\s*Latency Test\s*(v[\d.]+)?", re.IGNORECASE)
_ROW = re.compile(r"^(?:(\d+),)?(\d+)\s+([0-9.]+(?:[eE][+-]?\d+)?)(?:\s|$)")
# OSU benchmark title -> simfog collective; the point-to-point osu_latency is one message each way.
_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall",
          "alltoallpersonalizedexchange": "alltoall", "": "sendrecv"}
_PER_RANK_SIZE = ("allgather", "alltoall")  # OSU's size is one rank's (allgather) / one peer's (alltoall) part


def import_osu(path, *, ranks: int | str | None = None, nodes: int | None = None, transport: str = "unknown",
               backend: str = "mpi", collective: str | None = None) -> NetworkTrace:
    """OSU latency log (one or several runs) or Intel MPI Benchmarks log -> NetworkTrace, one row per measurement.

    One measurement (time_s = [average latency]) per size and run.

    `ranks` (one integer, or one per run "2,4,8") must agree with a `<nprocs>,` row prefix; without either it is
    read from a launcher line or the file name (see the module docstring), else ConfigError. `nodes` defaults to
    ranks (one process per node, an assumption recorded in provenance.notes). `collective` keeps only the runs of
    that collective. Raises ConfigError naming the file for a log of another tool, an unknown benchmark or bad
    options. extra["osu"] is a list with one entry per run (file, benchmark, version, ranks and where they came
    from, nodes, the measurements' index range).
    """
    path = str(path)
    name = Path(path).name
    text = files.read_text(path)
    if is_imb(text):
        return import_imb(path, ranks=ranks, nodes=nodes, transport=transport, backend=backend,
                          collective=collective)
    wanted = collective_option(collective, path)
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise ConfigError("nodes", nodes, "an integer >= 1", source=path)
    lines = [line.strip() for line in clean_lines(text)]
    headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    if not headers:
        hint = " (this looks like an nccl-tests log: use kind 'nccl-tests')" if "# nThread" in text else ""
        raise ConfigError("format", "(no '# OSU ... Latency Test' header)", EXPECTED + hint, source=path)
    last_line = max((i for i, line in enumerate(lines) if line), default=0)
    runs_raw = []
    previous_end = 0
    for k, h in enumerate(headers):
        header = _HEADER.match(lines[h])
        title = re.sub(r"[^a-z]", "", header.group(1).lower())
        if title not in _NAMES:
            raise ConfigError("benchmark", header.group(1), f"an OSU collective latency test ({EXPECTED})",
                              source=path)
        end = headers[k + 1] if k + 1 < len(headers) else len(lines)
        rows, prefixes, last_row = [], set(), h
        for number in range(h + 1, end):
            line = lines[number]
            if not line or line.startswith("#"):
                continue
            m = _ROW.match(line)
            if m is None:
                if line[0].isdigit() and number != last_line:
                    raise ConfigError(f"line {number + 1}", line[:60], EXPECTED, source=path)
                continue  # a launcher line, a warning, or the file's incomplete last line
            if m.group(1):
                prefixes.add(int(m.group(1)))
            rows.append((int(m.group(2)), float(m.group(3))))
            last_row = number
        if len(prefixes) > 1:
            raise ConfigError("nprocs prefix", sorted(prefixes), "one process count per run", source=path)
        runs_raw.append({"header": header, "collective": _NAMES[title], "rows": rows,
                         "prefix": next(iter(prefixes), None), "launcher": launcher_ranks(lines[previous_end:h])})
        previous_end = last_row + 1
    if not any(r["rows"] for r in runs_raw):
        raise ConfigError("rows", "(none)", EXPECTED + ": no data rows found", source=path)
    if wanted is not None:
        present = sorted({r["collective"] for r in runs_raw})
        runs_raw = [r for r in runs_raw if r["collective"] == wanted]
        if not runs_raw:
            raise ConfigError("collective", collective, f"one of the collectives in the log: {', '.join(present)}",
                              source=path)
    per_run = ranks_option(ranks, len(runs_raw), path)
    from_name = number_in_name(path) if len(runs_raw) == 1 else None
    measurements: list[Measurement] = []
    runs: list[dict] = []
    notes: list[str] = []
    for k, (run, given) in enumerate(zip(runs_raw, per_run, strict=True)):
        where = f" (run {k + 1} of {len(runs_raw)})" if len(runs_raw) > 1 else ""
        if not run["rows"]:
            warn(path, f"run {k + 1}{where} has no rows; skipped")
            continue
        prefix = run["prefix"]
        if given is not None:
            run_ranks, ranks_from = given, "given"
            if prefix is not None and prefix != given:
                raise ConfigError("ranks", given, f"{prefix}, the process count in the rows' prefix{where}",
                                  source=path)
        elif prefix is not None:
            run_ranks, ranks_from = prefix, "from the row prefix"
        elif run["launcher"] is not None:
            run_ranks, ranks_from = run["launcher"], "from the launcher line before the run"
        elif from_name is not None:
            run_ranks, ranks_from = from_name, "inferred from the file name"
            warn(path, f"ranks = {from_name} taken from the file name (the log does not say); pass ranks=N if wrong")
        else:
            raise ConfigError("ranks", f"(no '<nprocs>,' prefix in the rows{where})",
                              "pass ranks=N (one per run: 2,4,8)", source=path)
        if nodes is not None and nodes > run_ranks:
            raise ConfigError("nodes", nodes, f"an integer from 1 to ranks ({run_ranks}){where}", source=path)
        run_nodes = run_ranks if nodes is None else nodes
        coll = run["collective"]
        scale = run_ranks if coll in _PER_RANK_SIZE else 1
        first = len(measurements)
        measurements += [Measurement(coll, run_ranks, run_nodes, size * scale, (us * 1e-6,))
                         for size, us in run["rows"]]
        header = run["header"]
        if not runs:
            command = header.group(0).lstrip("# ").strip()
        runs.append({"file": name, "tool": "OSU", "run": k + 1, "benchmark": header.group(1),
                     "version": header.group(2), "collective": coll, "ranks": run_ranks, "ranks_from": ranks_from,
                     "nodes": run_nodes,
                     "nodes_from": "given" if nodes is not None else "assumed: one process per node",
                     "bytes_per_osu_size": scale, "measurements": [first, len(measurements)]})
        notes.append(f"{header.group(1) or 'Latency'}{where}: {len(run['rows'])} sizes, ranks = {run_ranks} "
                     f"{'(given)' if ranks_from == 'given' else ranks_from}")
    if not runs:
        raise ConfigError("rows", "(none)", EXPECTED + ": no data rows found", source=path)
    notes_text = (f"Imported by `simfog import osu {name}`. time_s = [OSU average latency], in seconds (average "
                  f"over iterations and ranks). {'; '.join(notes)}. nodes = "
                  + (f"{nodes} (given)" if nodes is not None else
                     "ranks (inferred: one process per node; the log does not say)")
                  + (". allgather/alltoall sizes are OSU's size times the process count (simfog's bytes: the "
                     "gathered output, the whole per-rank buffer)" if any(r["bytes_per_osu_size"] > 1 for r in runs)
                     else "")
                  + f". Backend {backend} and transport {transport} are not recorded in the log.")
    return NetworkTrace(
        backend=backend, transport=transport,
        provenance=Provenance(command=command,
                              date="unknown", host="unknown", source="imported", estimated=False, notes=notes_text),
        measurements=tuple(measurements), extra={"osu": runs})
