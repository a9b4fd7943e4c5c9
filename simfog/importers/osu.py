"""OSU Micro-Benchmarks collective latency logs (osu_allreduce & co.) -> NetworkTrace.

Rows are `<bytes> <avg latency us> [min max iterations]`; the MG-WFBP logs (shared/ref/mgwfbp-googlenet) prefix
each row with `<nprocs>,` in some files and not in others, so the prefix is optional and, when present, gives
the number of processes.
"""

from __future__ import annotations

import re
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.trace import Measurement, NetworkTrace, Provenance

EXPECTED = ("an OSU Micro-Benchmarks latency log ('# OSU MPI <Collective> Latency Test' header, then rows "
            "'[<nprocs>,]<bytes> <avg latency us>')")
_HEADER = re.compile(r"#\s*OSU\s+(?:MPI\S*\s+)?(.*?)\s*Latency Test\s*(v[\d.]+)?", re.IGNORECASE)
_ROW = re.compile(r"^(?:(\d+),)?(\d+)\s+([0-9.]+(?:[eE][+-]?\d+)?)(?:\s|$)")
# OSU benchmark title -> simfog collective; the point-to-point osu_latency is one message each way.
_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall",
          "alltoallpersonalizedexchange": "alltoall", "": "sendrecv"}


def import_osu(path, *, ranks: int | None = None, nodes: int | None = None, transport: str = "unknown",
               backend: str = "mpi") -> NetworkTrace:
    """OSU collective latency log -> NetworkTrace, one measurement (time_s = [average latency]) per size.

    `ranks` is read from the `<nprocs>,` row prefix when present, else must be given; both must agree.
    `nodes` defaults to `ranks` (one process per node, an assumption recorded in provenance.notes).
    Raises ConfigError naming the file for a log of another tool, an unknown benchmark or bad options.
    """
    path = str(path)
    text = files.read_text(path)
    lines = [line.rstrip("\r").strip() for line in text.split("\n")]
    header = next((m for m in map(_HEADER.match, lines) if m), None)
    if header is None:
        hint = " (this looks like an nccl-tests log: use kind 'nccl-tests')" if "# nThread" in text else ""
        raise ConfigError("format", "(no '# OSU ... Latency Test' header)", EXPECTED + hint, source=path)
    title = re.sub(r"[^a-z]", "", header.group(1).lower())
    if title not in _NAMES:
        raise ConfigError("benchmark", header.group(1), f"an OSU collective latency test ({EXPECTED})", source=path)
    collective = _NAMES[title]
    rows, prefixes = [], set()
    for number, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        m = _ROW.match(line)
        if m is None:
            raise ConfigError(f"line {number}", line[:60], EXPECTED, source=path)
        if m.group(1):
            prefixes.add(int(m.group(1)))
        rows.append((int(m.group(2)), float(m.group(3))))
    if not rows:
        raise ConfigError("rows", "(none)", EXPECTED + ": no data rows found", source=path)
    if len(prefixes) > 1:
        raise ConfigError("nprocs prefix", sorted(prefixes), "one process count per file", source=path)
    from_file = next(iter(prefixes), None)
    if ranks is None:
        if from_file is None:
            raise ConfigError("ranks", "(no '<nprocs>,' prefix in the rows)", "pass ranks=N", source=path)
        ranks = from_file
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ConfigError("ranks", ranks, "an integer >= 1", source=path)
    if from_file is not None and from_file != ranks:
        raise ConfigError("ranks", ranks, f"{from_file}, the process count in the rows' prefix", source=path)
    nodes_given = nodes is not None
    nodes = ranks if nodes is None else nodes
    if not isinstance(nodes, int) or isinstance(nodes, bool) or not 1 <= nodes <= ranks:
        raise ConfigError("nodes", nodes, f"an integer from 1 to ranks ({ranks})", source=path)
    notes = (f"Imported by `simfog import osu {Path(path).name}`. time_s = [OSU average latency], in seconds "
             f"(average over iterations and ranks). ranks = {ranks} "
             f"{'from the row prefix' if from_file is not None else '(given)'}; nodes = {nodes} "
             f"{'(given)' if nodes_given else '(inferred: one process per node; the log does not say)'}. "
             f"Backend {backend} and transport {transport} are not recorded in the log.")
    return NetworkTrace(
        backend=backend, transport=transport,
        provenance=Provenance(command=header.group(0).lstrip("# ").strip(), date="unknown", host="unknown",
                              source="imported", estimated=False, notes=notes),
        measurements=tuple(Measurement(collective, ranks, nodes, size, (us * 1e-6,)) for size, us in rows),
        extra={"osu": {"file": Path(path).name, "benchmark": header.group(1), "version": header.group(2)}})
