"""nccl-tests (`all_reduce_perf` & co.) output logs -> NetworkTrace.

Handles the quirks of real logs (shared/ref/nccl-tests/PROVENANCE.md): CRLF line endings, Open MPI
`--tag-output` prefixes `[1,0]<stdout>:` (also when one is interleaved inside a line, as in Echo's
`nccl_128.log`), UCX warning lines before the header, and column widths that differ between builds (rows are
split on whitespace). Old logs (no `Group`/`root` columns, `error` instead of `#wrong`) and newer ones both parse.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.trace import COLLECTIVES, Measurement, NetworkTrace, Provenance

EXPECTED = ("an nccl-tests log (e.g. all_reduce_perf output: a '# nThread ...' header, '# Using devices' rank "
            "lines and rows 'size count type redop time algbw busbw ...')")
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)(.*)")
_DEVICE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                     r"\[(\S+)\]\s+(.*\S)")
_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_COLLECTIVE_LINE = re.compile(r"#\s*Collective test starting:\s*(\w+?)(?:_perf)?\s*$")
_UCX_STAMP = re.compile(r"^\[(\d{9,10}\.\d+)\]")
_NCCL_NET = re.compile(r"NET/(IB|Socket)")
TIMES = ("both", "out-of-place", "in-place")
# busbw / algbw per collective, from nccl-tests doc/PERFORMANCE.md (n = ranks).
_BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def _clean_lines(text: str) -> list[str]:
    """Lines without CR and without Open MPI output tags anywhere in the line."""
    return [_TAG.sub("", line).rstrip("\r").rstrip() for line in text.split("\n")]


def _row(line: str) -> tuple | None:
    """(bytes, count, type, redop, oop (time_us, algbw, busbw), ip (...)) for a data row, else None."""
    tok = line.split()
    if len(tok) < 12 or not (tok[0].isdigit() and tok[1].isdigit()):
        return None
    rest = tok[4:]
    if len(rest) == 9 and rest[0].lstrip("-").isdigit():  # newer builds: a `root` column (-1 if unused)
        rest = rest[1:]
    try:
        oop = tuple(float(x) for x in rest[0:3])
        ip = tuple(float(x) for x in rest[4:7])
    except ValueError:
        return None
    return int(tok[0]), int(tok[1]), tok[2], tok[3], oop, ip


def _guess_collective(rows: list, ranks: int, path: str) -> tuple[str, str]:
    """(collective, how) for a log that does not name it: allreduce (all_reduce_perf, by far the most common
    nccl-tests binary) if its busbw/algbw factor 2(n-1)/n fits the rows, else ConfigError asking for the name."""
    ratios = [r[4][2] / r[4][1] for r in rows if r[4][1] >= 1.0]  # algbw >= 1 GB/s: 2 decimals are enough
    if ranks == 1 or not ratios:
        return "allreduce", "assumed (busbw/algbw cannot tell at 1 rank)"
    ratio = sorted(ratios)[len(ratios) // 2]
    fits = [c for c, f in _BUS_FACTOR.items() if abs(f(ranks) - ratio) <= 0.02 * f(ranks)]
    if "allreduce" in fits:
        return "allreduce", (f"assumed; busbw/algbw = {ratio:.3f} = 2(n-1)/n confirms it" if len(fits) == 1 else
                             f"assumed; busbw/algbw = {ratio:.3f} also fits {', '.join(fits[1:])} at {ranks} ranks")
    raise ConfigError("collective", "(not named in the log)",
                      f"pass collective=NAME: busbw/algbw = {ratio:.3f} at {ranks} ranks fits "
                      f"{', '.join(fits) or 'no collective'}",
                      source=path)


def _transport(text: str, nodes: int, ranks: int, devices: list[str]) -> tuple[str, str]:
    """(transport, why). NCCL_DEBUG lines name the network when present; otherwise only a single node of SXM
    GPUs tells us anything (NVLink); a multi-node log does not say whether the NICs are IB or Ethernet."""
    net = {m.group(1) for m in _NCCL_NET.finditer(text)}
    if nodes > 1 and len(net) == 1:
        return ("ib" if net == {"IB"} else "tcp"), "from the NCCL_DEBUG NET/ lines"
    if nodes == 1 and ranks > 1 and devices and all("SXM" in d for d in devices):
        return "nvlink", "inferred: one node of SXM GPUs (SXM boards connect GPUs with NVLink)"
    return "unknown", "not recorded in the log (pass transport=...)"


def import_nccl_tests(path, *, collective: str | None = None, transport: str | None = None,
                      ranks: int | None = None, times: str = "both") -> NetworkTrace:
    """nccl-tests log (all_reduce_perf ...; Echo/ABCI formats) -> NetworkTrace, one measurement per size.

    time_s of a measurement is [out-of-place, in-place] rank-0 average time in seconds (`times` keeps one).
    `ranks` come from the '# Using devices' lines, `nodes` = distinct host names there. `collective` is inferred
    from busbw/algbw (the old logs do not name it) unless given; `transport` is inferred where the log allows
    (see notes). Raises ConfigError naming the file when the log is not an nccl-tests log or an option is bad.
    """
    path = str(path)
    if times not in TIMES:
        raise ConfigError("times", times, f"one of {', '.join(TIMES)}", source=path)
    text = files.read_text(path)
    lines = _clean_lines(text)
    header = next((m for m in map(_HEADER.match, lines) if m), None)
    if header is None:
        hint = " (this looks like an OSU log: use kind 'osu')" if "# OSU" in text else ""
        raise ConfigError("format", "(no '# nThread' header)", EXPECTED + hint, source=path)
    devices = [m for m in map(_DEVICE.match, lines) if m]
    rows = [r for r in map(_row, lines) if r]
    if not rows:
        raise ConfigError("rows", "(none)", EXPECTED + ": no data rows found", source=path)
    by_rank = {int(m.group(1)): m for m in devices}
    hosts = sorted({m.group(3) for m in by_rank.values()})
    if ranks is None:
        if not by_rank:
            raise ConfigError("ranks", "(no '# Using devices' lines)", "pass ranks=N", source=path)
        ranks = len(by_rank)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ConfigError("ranks", ranks, "an integer >= 1", source=path)
    nodes = min(len(hosts), ranks) if hosts else 1
    named = next((m.group(1) for m in map(_COLLECTIVE_LINE.match, lines) if m), None)
    how_collective = "given"
    if collective is None and named:
        collective, how_collective = _normalise(named, path), "named in the log"
    elif collective is None:
        collective, how_collective = _guess_collective(rows, ranks, path)
    elif not isinstance(collective, str) or collective.replace("-", "_") not in COLLECTIVES:
        raise ConfigError("collective", collective, f"one of {', '.join(COLLECTIVES)}", source=path)
    collective = collective.replace("-", "_")
    gpu_names = sorted({m.group(6) for m in by_rank.values()})
    how = "given"
    if transport is None:
        transport, how = _transport(text, nodes, ranks, gpu_names)
    pick = {"both": slice(0, 2), "out-of-place": slice(0, 1), "in-place": slice(1, 2)}[times]
    measurements = tuple(
        Measurement(collective, ranks, nodes, size, tuple(t * 1e-6 for t in (oop[0], ip[0]))[pick])
        for size, _, _, _, oop, ip in rows)
    avg = next((float(m.group(1)) for m in map(_AVG_BUSBW.match, lines) if m), None)
    stamp = next((float(m.group(1)) for m in map(_UCX_STAMP.match, lines) if m), None)
    date = (datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if stamp
            else "unknown")
    notes = (f"Imported by `simfog import nccl-tests {Path(path).name}`. time_s = "
             f"{'[out-of-place, in-place]' if times == 'both' else '[' + times + ']'} average per operation over "
             f"the log's iterations, rank 0's view, in seconds. ranks = {ranks} from the '# Using devices' lines"
             f"{'' if by_rank else ' (given)'}; nodes = {nodes} distinct host names (MPI output tags removed "
             f"first, also where interleaved inside a line). Collective {collective}: {how_collective}. "
             f"Transport {transport}: {how}. Date: {'first UCX warning time stamp' if stamp else 'not recorded'}."
             + (" At 1 rank the in-place operation is a no-op: its time is only a launch floor." if ranks == 1
                else ""))
    extra = {"nccl_tests": {
        "file": Path(path).name, "header": header.group(0).lstrip("# ").strip(), "hosts": hosts,
        "gpus": gpu_names, "avg_busbw_GBps": avg,
        "busbw_GBps": [[oop[2], ip[2]] for *_, oop, ip in rows]}}
    return NetworkTrace(
        backend="nccl", transport=transport,
        provenance=Provenance(command=header.group(0).lstrip("# ").strip(), date=date,
                              host=by_rank[min(by_rank)].group(3) if by_rank else "unknown",
                              source="imported", estimated=False, notes=notes),
        measurements=measurements, extra=extra)


def _normalise(name: str, path: str) -> str:
    """'all_reduce' -> 'allreduce' etc.; ConfigError for names simfog does not model."""
    key = name.lower().replace("_", "")
    table = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
             "broadcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall", "sendrecv": "sendrecv"}
    if key not in table:
        raise ConfigError("collective", name, f"one of {', '.join(COLLECTIVES)} (pass collective=...)", source=path)
    return table[key]
