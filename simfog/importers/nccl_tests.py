"""nccl-tests (`all_reduce_perf` & co.) output logs -> NetworkTrace.

Reads the three output formats nccl-tests has printed (checked against NVIDIA/nccl-tests src/common.cu and
src/util.cu at b188a15 .. a0b82b2):

- old (2018 .. mid 2022, e.g. bench/data/ref/nccl-tests): `#   Rank  0 Pid ... on HOST device 0 [0x00] GPU` device
  lines, an `error` column (max. absolute error, `2e-07`, or `N/A`), and a row prefix that depends on the test:
  `size count type redop` (all_reduce, reduce_scatter, alltoall), `size count type` (all_gather, sendrecv),
  `size count type root` (broadcast), `size count type redop root` (reduce);
- middle (Aug 2022 ..): every row is `size count type redop root`, the redop empty or `none` where there is none
  and the root -1 where there is none, then `#wrong` (wrong elements) instead of `error`; `agg iters` and `graph`
  in the header; from Sep 2022 the device lines carry `Group N`;
- new (Oct 2025 ..): a `# nccl-tests version X nccl-headers=N nccl-library=N` line and `# Collective test
  starting: all_reduce_perf` before the header, `# Collective test concluded: ...` after the footer, so several
  tests can follow each other in one file; optional per-iteration columns (`i_min i_max i_p99 i_cv%` after each
  half) and a time stamp at the end of the row.

Each test in a file (a `# nThread` header with its rows) is one run; every row becomes one Measurement whose time_s
is [out-of-place, in-place]. Also handled: CRLF line endings, Open MPI `--tag-output` prefixes `[1,0]<stdout>:`
(also when one is interleaved inside a line, as in Echo's `nccl_128.log`), Slurm `srun -l` task labels `0: `,
UCX or NCCL_DEBUG lines anywhere, column widths that differ between builds (rows are split on whitespace), several
data types (`-d all`), sizes of 0, and a truncated log (no `# Avg bus bandwidth` footer: imported with an
ImporterWarning naming the last size).
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from pathlib import Path

from simfog import files
from simfog.errors import ConfigError
from simfog.importers.logs import clean_lines, is_number, ranks_option, warn
from simfog.importers.nccl_debug import read_debug
from simfog.trace import COLLECTIVES, Measurement, NetworkTrace, Provenance

EXPECTED = ("an nccl-tests log (e.g. all_reduce_perf output: a '# nThread ...' header, '# Using devices' rank "
            "lines and rows 'size count type redop time algbw busbw ...')")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)(.*)")
_DEVICE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                     r"\[(\S+)\]\s+(.*\S)")
_COLUMNS = re.compile(r"#\s*size\s+count\s+type\s+(.*)")
_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|-?nan|-?inf)", re.IGNORECASE)
_OUT_OF_BOUNDS = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"#\s*nccl-tests version\s+(\S+)(?:\s+nccl-headers=(\d+))?(?:\s+nccl-library=(\d+))?")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_UCX_STAMP = re.compile(r"^\[(\d{9,10}\.\d+)\]")
_NCCL_NET = re.compile(r"NET/(IB|Socket|OFI)\b")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
TIMES = ("both", "out-of-place", "in-place")
# busbw / algbw per collective, from nccl-tests doc/PERFORMANCE.md (n = ranks).
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}
# Old format only: the columns between `type` and `time`, per test (src/<test>.cu print_header at f773748).
_OLD_COLUMNS = {"allreduce": ("redop",), "reduce_scatter": ("redop",), "alltoall": ("redop",),
                "allgather": (), "sendrecv": (), "broadcast": ("root",), "reduce": ("redop", "root")}
# Middle and new formats: (a redop in the rows, a root >= 0 in the rows) per test (TimeTest calls in src/<test>.cu).
_SIGNATURE = {"allreduce": (True, False), "reduce_scatter": (True, False), "sendrecv": (True, False),
              "reduce": (True, True), "broadcast": (False, True), "allgather": (False, False),
              "alltoall": (False, False)}
# nccl-tests program / collective names -> simfog's; the tests simfog does not model map to None.
_NAMES = {"allreduce": "allreduce", "allgather": "allgather", "reducescatter": "reduce_scatter",
          "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce", "alltoall": "alltoall",
          "sendrecv": "sendrecv", "gather": None, "scatter": None, "hypercube": None, "alltoallv": None}


def _floats(tokens: list[str]) -> tuple[float, float, float] | None:
    try:
        return float(tokens[0]), float(tokens[1]), float(tokens[2])
    except ValueError:
        return None


def _row(line: str) -> dict | None:
    """A data row -> {bytes, count, type, redop, root, oop: (time_us, algbw, busbw), ip: (...), stamp}, else None.

    Split on whitespace; the layout is told by the number of tokens after `type` (see the module docstring): an
    optional redop word, an optional root integer, 8 values (time algbw busbw error|#wrong, twice) or 16 (each half
    followed by i_min i_max i_p99 i_cv%), optionally a `YYYY-MM-DD HH:MM:SS` time stamp."""
    tok = line.split()
    if len(tok) < 11 or not (tok[0].isdigit() and tok[1].isdigit()) or is_number(tok[2]):
        return None
    rest = tok[3:]
    redop = rest.pop(0) if not is_number(rest[0]) else ""
    stamp = None
    if len(rest) >= 2 and _DATE.fullmatch(rest[-2]):
        stamp, rest = " ".join(rest[-2:]), rest[:-2]
    root = None
    if len(rest) in (9, 17):
        if not rest[0].lstrip("-").isdigit():
            return None
        root = int(rest.pop(0))
    if len(rest) not in (8, 16):
        return None
    half = len(rest) // 2
    oop, ip = _floats(rest[:3]), _floats(rest[half:half + 3])
    if oop is None or ip is None or not (is_number(rest[3]) or rest[3] == "N/A"):
        return None
    return {"bytes": int(tok[0]), "count": int(tok[1]), "type": tok[2], "redop": redop, "root": root,
            "oop": oop, "ip": ip, "stamp": stamp}


def normalise(name: str) -> str | None:
    """'all_reduce_perf' / 'all_reduce' / 'reduce-scatter' -> simfog's name; None for an nccl-tests test simfog does
    not model (gather, scatter, ...); KeyError for a name that is no nccl-tests test at all."""
    key = Path(name).name.lower()
    key = re.sub(r"\.exe$", "", key)
    key = re.sub(r"_perf.*$", "", key).replace("_", "").replace("-", "")
    if key in _NAMES:
        return _NAMES[key]
    raise KeyError(name)


def _given_collective(collective: object, path: str) -> str | None:
    if collective is None:
        return None
    allowed = f"one of {', '.join(COLLECTIVES)}"
    if not isinstance(collective, str):
        raise ConfigError("collective", collective, allowed, source=path)
    try:
        name = normalise(collective)
    except KeyError:
        name = None
    if name is None:
        raise ConfigError("collective", collective, allowed, source=path)
    return name


def _guess_collective(rows: list[dict], ranks: int, columns: tuple[str, ...] | None, path: str,
                      where: str) -> tuple[str, str]:
    """(collective, how) for a run whose log does not name it. The layout narrows the candidates: in the old
    format the column headings (all_gather has no redop column, broadcast a root but no redop, ...), in the newer
    ones the rows' redop (`none` or empty without one) and root (-1 when unused); busbw/algbw, a known factor of n
    per collective, narrows them further. allreduce (all_reduce_perf, by far the most common binary) is taken when
    it fits; another collective when it is the only one that fits; otherwise ConfigError asking for the name."""
    if columns is not None:
        candidates = [c for c in COLLECTIVES if _OLD_COLUMNS[c] == columns]
        how_columns = f"columns '{' '.join(columns) or '(none)'}' before time; "
    else:
        sign = (any(r["redop"] not in ("", "none") for r in rows),
                any(r["root"] is not None and r["root"] >= 0 for r in rows))
        candidates = [c for c in COLLECTIVES if _SIGNATURE[c] == sign]
        how_columns = f"rows {'with' if sign[0] else 'without'} a redop, {'with' if sign[1] else 'without'} a root; "
    ratios = [r["oop"][2] / r["oop"][1] for r in rows if r["oop"][1] >= 1.0]  # algbw >= 1 GB/s: 2 decimals do
    ratio = sorted(ratios)[len(ratios) // 2] if ratios and ranks > 1 else None
    if ratio is not None:
        candidates = [c for c in candidates if abs(BUS_FACTOR[c](ranks) - ratio) <= 0.02 * BUS_FACTOR[c](ranks)]
    told = how_columns + (f"busbw/algbw = {ratio:.3f} at {ranks} ranks" if ratio is not None else
                          "busbw/algbw cannot tell" + (" at 1 rank" if ranks == 1 else " (no row with algbw >= 1)"))
    if "allreduce" in candidates:
        others = [c for c in candidates if c != "allreduce"]
        if ratio is not None and not others:
            return "allreduce", f"assumed; {told} = 2(n-1)/n confirms it"
        return "allreduce", f"assumed; {told}" + (f" (also fits {', '.join(others)})" if others else "")
    if len(candidates) == 1:
        return candidates[0], f"inferred: {told} fits only {candidates[0]}"
    raise ConfigError("collective", f"(not named in the log{where})",
                      f"pass collective=NAME (simfog import: --collective NAME): {told} fits "
                      f"{', '.join(candidates) or 'no collective'}", source=path)


def _transport(text: str, nodes: int, ranks: int, devices: list[str]) -> tuple[str, str]:
    """(transport, why). NCCL_DEBUG lines name the network when present; otherwise only a single node of SXM
    GPUs tells us anything (NVLink); a multi-node log does not say whether the NICs are IB or Ethernet."""
    net = {m.group(1) for m in _NCCL_NET.finditer(text)}
    if nodes > 1 and len(net) == 1:
        return {"IB": "ib", "Socket": "tcp", "OFI": "ofi"}[net.pop()], "from the NCCL_DEBUG NET/ lines"
    if nodes == 1 and ranks > 1 and devices and all("SXM" in d for d in devices):
        return "nvlink", "inferred: one node of SXM GPUs (SXM boards connect GPUs with NVLink)"
    return "unknown", "not recorded in the log (pass transport=...)"


_SRUN_LABEL = re.compile(r"^ *\d+: ")


def _without_srun_labels(lines: list[str]) -> list[str]:
    """Lines without Slurm's `srun -l` task labels (`0: # nThread ...`; right-aligned from 10 tasks on, ` 0: ` and
    `  0: ` from 100), when the header carries one."""
    if any(_HEADER.match(line) for line in lines) or not any(
            _HEADER.match(_SRUN_LABEL.sub("", line)) for line in lines):
        return lines
    return [_SRUN_LABEL.sub("", line) for line in lines]


def _nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE -> 'X.Y.Z' (X*10000 + Y*100 + Z from 2.9, X*1000 + Y*100 + Z before)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _split_runs(lines: list[str]) -> list[tuple[int, int, int]]:
    """(start, header, end) line indexes of every test in the log: `header` is its `# nThread` line, `start` the
    line after the previous test's header (its naming lines come before the header), `end` the next header."""
    headers = [i for i, line in enumerate(lines) if _HEADER.match(line)]
    return [(headers[k - 1] + 1 if k else 0, h, headers[k + 1] if k + 1 < len(headers) else len(lines))
            for k, h in enumerate(headers)]


def _layout(devices: list[re.Match], ranks: int) -> dict:
    """hosts, ranks per host, nodes, GPUs per node (None unless every host runs as many ranks), GPU models."""
    per_host = Counter(m.group(3) for m in devices)
    hosts = sorted(per_host)
    nodes = min(len(hosts), ranks) if hosts else 1
    counts = set(per_host.values())
    gpus = sorted({m.group(6) for m in devices})
    return {"hosts": hosts, "nodes": nodes, "ranks_per_host": dict(sorted(per_host.items())),
            "gpus_per_node": counts.pop() if len(counts) == 1 else None, "gpus": gpus,
            "gpu": gpus[0] if len(gpus) == 1 else None}


def import_nccl_tests(path, *, collective: str | None = None, transport: str | None = None,
                      ranks: int | str | None = None, times: str = "both") -> NetworkTrace:
    """nccl-tests log (all_reduce_perf & co.; old, middle, new formats) -> NetworkTrace, one row per measurement.

    Reads every test of the file (the new format can hold several, each its own collective).

    time_s of a measurement is [out-of-place, in-place] rank-0 average time in seconds (`times` keeps one).
    `ranks` come from the '# Using devices' lines (or given: one integer, or one per test "8,16"), `nodes` = distinct
    host names there. The collective is the one the log names (`# Collective test starting:`); in logs that do not
    name it, `collective` if given, else inferred from the columns and busbw/algbw. Where the log names it, a given
    `collective` keeps only that collective's tests. `transport` is inferred where the log allows (see notes).
    Per test, extra["nccl_tests"] (a list) holds the layout (hosts, GPUs per node, GPU model), the header, versions,
    data types, busbw, the measurements' index range and what NCCL_DEBUG=INFO lines state (nccl_debug: release,
    network, NICs, channels, GPU-NIC path, NVLS, CPU vendor; simfog.importers.nccl_debug). Raises ConfigError
    naming the file when it is not an nccl-tests log or an option is bad; warns (ImporterWarning) for a truncated
    log or an uneven layout.
    """
    path = str(path)
    name = Path(path).name
    if times not in TIMES:
        raise ConfigError("times", times, f"one of {', '.join(TIMES)}", source=path)
    wanted = _given_collective(collective, path)
    text = files.read_text(path)
    lines = _without_srun_labels(clean_lines(text))
    spans = _split_runs(lines)
    if not spans:
        hint = " (this looks like an OSU or IMB log: use kind 'osu')" if re.search(
            r"# OSU|# Benchmarking", text) else ""
        raise ConfigError("format", "(no '# nThread' header)", EXPECTED + hint, source=path)
    per_run_ranks = ranks_option(ranks, len(spans), path)
    stamp = next((float(m.group(1)) for m in map(_UCX_STAMP.match, lines) if m), None)
    nccl_version = next((m.group(1) for m in map(_NCCL_VERSION.search, lines) if m), None)
    pick = {"both": slice(0, 2), "out-of-place": slice(0, 1), "in-place": slice(1, 2)}[times]
    measurements: list[Measurement] = []
    runs: list[dict] = []
    notes: list[str] = []
    named_in_file: list[str] = []
    host = "unknown"
    for k, ((start, h, end), given_ranks) in enumerate(zip(spans, per_run_ranks, strict=True)):
        where = f", test {k + 1} of {len(spans)}" if len(spans) > 1 else ""
        before, body = lines[start:h], lines[h:end]
        program = next((m.group(1) for m in map(_STARTING.match, reversed(before)) if m), None)
        version = next((m for m in map(_VERSION.match, reversed(before)) if m), None)
        header = _HEADER.match(lines[h])
        devices = list({int(m.group(1)): m for m in map(_DEVICE.match, body) if m}.values())
        rows = [r for r in map(_row, body) if r]
        columns_line = next((m.group(1).split() for m in map(_COLUMNS.match, body) if m), None)
        avg = next((float(m.group(1)) for m in map(_AVG_BUSBW.match, body) if m), None)
        oob = next((int(m.group(1)) for m in map(_OUT_OF_BOUNDS.match, body) if m), None)
        label = program or f"test {k + 1}"
        if program is not None:
            try:
                named = normalise(program)
            except KeyError:
                named = None
            if named is None:
                if len(spans) == 1:
                    raise ConfigError("collective", program, f"one of {', '.join(COLLECTIVES)}: simfog does not "
                                      "model this nccl-tests test", source=path)
                warn(path, f"test {k + 1} ({program}) is skipped: simfog does not model that collective")
                continue
            named_in_file.append(named)
            if wanted is not None and named != wanted:
                continue
        if not rows:
            if len(spans) > 1:
                warn(path, f"{label}{where} has no data rows (the log ends early?); skipped")
            continue
        run_ranks = given_ranks if given_ranks is not None else len(devices) or None
        if run_ranks is None:
            raise ConfigError("ranks", f"(no '# Using devices' lines{where})", "pass ranks=N", source=path)
        layout = _layout(devices, run_ranks)
        nodes = layout["nodes"]
        if program is not None:
            coll, how_collective = named, f"named in the log ({program})"
        elif wanted is not None:
            coll, how_collective = wanted, "given"
        else:
            old = columns_line is not None and "#wrong" not in columns_line
            cols = None
            if old:
                before_time = columns_line[:next((i for i, c in enumerate(columns_line) if c in ("time", "cputime")),
                                                 len(columns_line))]
                cols = tuple(before_time)
            coll, how_collective = _guess_collective(rows, run_ranks, cols, path, where)
        if devices and layout["gpus_per_node"] is None:
            spread = ", ".join(f"{host_} {n}" for host_, n in layout["ranks_per_host"].items())
            warn(path, f"{label}{where}: ranks per node differ ({spread}); gpus_per_node is left unset")
        how_transport = "given"
        run_transport = transport
        if run_transport is None:
            run_transport, how_transport = _transport("\n".join(lines[start:end]), nodes, run_ranks, layout["gpus"])
        fmt = "new" if (program or version) else (
            "middle" if (columns_line and "#wrong" in columns_line) or "agg iters" in header.group(5) else "old")
        truncated = avg is None
        if truncated:
            last_line = " ".join(next((line for line in reversed(body) if line.strip()), "").split())
            partial = "" if _row(last_line) or not last_line.split()[0].isdigit() else (
                f"; the incomplete last line {last_line[:40]!r} was dropped")
            warn(path, f"{label}{where} has no '# Avg bus bandwidth' footer: the log is truncated; the last size "
                 f"read is {rows[-1]['bytes']} B ({len(rows)} rows kept{partial})")
        if oob:
            warn(path, f"{label}{where}: 'Out of bounds values : {oob} FAILED': nccl-tests found wrong results; "
                 "the times are kept")
        first = len(measurements)
        if not runs and devices:
            host = min(devices, key=lambda m: int(m.group(1))).group(3)
        measurements += [Measurement(coll, run_ranks, nodes, r["bytes"],
                                     tuple(t * 1e-6 for t in (r["oop"][0], r["ip"][0]))[pick]) for r in rows]
        runs.append({
            "file": name, "test": k + 1, "program": program, "format": fmt,
            "nccl_tests_version": version.group(1) if version else None,
            "nccl_version": _nccl_version(int(version.group(3))) if version and version.group(3) else nccl_version,
            "header": header.group(0).lstrip("# ").strip(), "collective": coll, "collective_from": how_collective,
            "ranks": run_ranks, **layout, "transport": run_transport,
            "nccl_debug": read_debug(lines[start:end]),
            "measurements": [first, len(measurements)],
            "types": [r["type"] for r in rows], "redops": [r["redop"] for r in rows],
            "busbw_GBps": [[r["oop"][2], r["ip"][2]] for r in rows],
            "avg_busbw_GBps": avg, "out_of_bounds": oob, "truncated": truncated,
            "last_bytes": rows[-1]["bytes"]})
        gpn = layout["gpus_per_node"]
        notes.append(
            f"{label}{where}: {coll} ({how_collective}); {len(rows)} rows; ranks = {run_ranks} "
            f"{'(given)' if given_ranks is not None else 'from the # Using devices lines'}, nodes = {nodes} distinct "
            f"host names (MPI output tags removed first, also where interleaved inside a line)"
            + (f", {gpn} GPUs per node" if gpn else "") + (f", {layout['gpu']}" if layout["gpu"] else "")
            + f"; transport {run_transport}: {how_transport}"
            + ("; TRUNCATED (no footer)" if truncated else "")
            + ("; at 1 rank the in-place operation is a no-op: its time is only a launch floor" if run_ranks == 1
               else "") + ".")
    if not runs:
        if wanted is not None and named_in_file:
            raise ConfigError("collective", collective, f"one of the collectives in the log: "
                              f"{', '.join(dict.fromkeys(named_in_file))}", source=path)
        raise ConfigError("rows", "(none)", EXPECTED + ": no data rows found", source=path)
    transports = {r["transport"] for r in runs}
    date = (datetime.datetime.fromtimestamp(stamp, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if stamp
            else "unknown")
    text_notes = (f"Imported by `simfog import nccl-tests {name}`. time_s = "
                  f"{'[out-of-place, in-place]' if times == 'both' else '[' + times + ']'} average per operation over "
                  f"the log's iterations, rank 0's view, in seconds. " + " ".join(notes)
                  + f" Date: {'first UCX warning time stamp' if stamp else 'not recorded'}.")
    return NetworkTrace(
        backend="nccl", transport=transports.pop() if len(transports) == 1 else "mixed",
        provenance=Provenance(command=runs[0]["header"] if len(runs) == 1 else f"simfog import nccl-tests {name}",
                              date=date, host=host, source="imported", estimated=False,
                              notes=text_notes),
        measurements=tuple(measurements), extra={"nccl_tests": runs})
