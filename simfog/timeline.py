"""Timelines in the Chrome trace event format, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per rank (pid = rank, named "rank N"), two threads: tid 0 "compute" (forward, backward, optimizer) and
tid 1 "communication" (one event per collective, named after its bucket, and "wait: bucketK" while the rank waited
for its peers). Events are complete events (ph "X") with ts and dur in microseconds, rounded to whole nanoseconds so
that back-to-back intervals never overlap by a rounding error: Perfetto does not display overlapping X events on one
thread. Should a measured timeline ever put two overlapping intervals on one track, the later one goes to an extra
thread ("communication 2", ...) instead. Format: the Trace Event Format document
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), "JSON Object Format".

The core, `chrome_trace_from_intervals`, takes a DataFrame with the columns of `Result.intervals()` (rank,
iteration, kind, name, start_s, end_s), so the validator exports measured runs through the same code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pandas as pd

from simfog.errors import ConfigError

#: Ranks shown by default. Perfetto's UI slows down with thousands of tracks and the JSON grows with every rank
#: (2048 ranks x a few hundred intervals x iterations is millions of events, hundreds of MB, all loaded into the
#: browser's memory). The first and last ranks hold the first and last nodes, where placement boundary effects
#: show; on the symmetric fast path every rank is identical anyway.
MAX_RANKS = 64
COMPUTE_KINDS = ("forward", "backward", "optimizer")
COMM_KINDS = ("comm", "wait")
REQUIRED = ["rank", "iteration", "kind", "name", "start_s", "end_s"]
TRACKS = ("compute", "communication")


def select_ranks(total: int, ranks: Sequence[int] | None = None, *, max_ranks: int = MAX_RANKS) -> list[int]:
    """The ranks to show out of `total`: `ranks` itself when given (validated), else all when there are at most
    `max_ranks`, else the first and the last max_ranks // 2. Raises ConfigError for ranks outside 0..total-1."""
    if ranks is not None:
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < total]
        if bad or not len(ranks):
            raise ConfigError("timeline ranks (--timeline-ranks)", list(ranks), f"one or more ranks in 0..{total - 1}")
        return sorted(set(ranks))
    if total <= max_ranks:
        return list(range(total))
    half = max_ranks // 2
    return list(range(half)) + list(range(total - (max_ranks - half), total))


def parse_rank_list(text: str, *, field: str = "ranks") -> list[int]:
    """"0-7,120-127,300" -> [0..7, 120..127, 300]. Raises ConfigError naming `field` for anything else."""
    out = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            a, _, b = part.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    except ValueError:
        out = []
    if not out:
        raise ConfigError(field, text, 'ranks and ranges, e.g. "0-7,120-127"')
    return out


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _lanes(events: list[dict]) -> list[int]:
    """Per event (sorted by ts), the lane of its track where it does not overlap an earlier event (0 nearly always)."""
    ends: list[int] = []
    out = []
    for e in events:
        start = e["_start_ns"]
        lane = next((k for k, end in enumerate(ends) if start >= end), len(ends))
        if lane == len(ends):
            ends.append(0)
        ends[lane] = e["_end_ns"]
        out.append(lane)
    return out


def chrome_trace_from_intervals(df: pd.DataFrame, *, ranks: Sequence[int] | None = None, total_ranks: int | None = None,
                                bytes_by_name: Mapping[str, float] | None = None, max_ranks: int = MAX_RANKS,
                                metadata: Mapping | None = None) -> dict:
    """The Chrome trace (a JSON-serialisable dict with "traceEvents") of intervals in the `Result.intervals()`
    schema. An optional `bytes` column, or `bytes_by_name` (bucket name -> bytes), puts the bytes of each
    collective into its args. `total_ranks` (default: the ranks present) is what `ranks`/`max_ranks` select from;
    which ranks are shown, out of how many, and why, is recorded in "otherData". Raises ConfigError for missing
    columns, an unknown kind or an interval that ends before it starts."""
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ConfigError("intervals", missing, f"a DataFrame with columns {', '.join(REQUIRED)}")
    unknown = sorted(set(df["kind"]) - set(COMPUTE_KINDS + COMM_KINDS))
    if unknown:
        raise ConfigError("intervals.kind", unknown[0], f"one of {', '.join(COMPUTE_KINDS + COMM_KINDS)}")
    if (df["end_s"] < df["start_s"]).any():
        bad = df[df["end_s"] < df["start_s"]].iloc[0]
        raise ConfigError("intervals.end_s", float(bad.end_s), f"a time >= start_s ({float(bad.start_s)})")
    present = sorted(int(r) for r in df["rank"].unique())
    total = total_ranks if total_ranks is not None else (present[-1] + 1 if present else 0)
    shown = select_ranks(total, ranks, max_ranks=max_ranks) if total else []
    df = df[df["rank"].isin(shown)]
    sizes = dict(bytes_by_name or {})
    has_bytes = "bytes" in df.columns

    tracks: dict[tuple[int, int], list[dict]] = {}
    for row in df.itertuples(index=False):
        track = 0 if row.kind in COMPUTE_KINDS else 1
        name = f"wait: {row.name}" if row.kind == "wait" else str(row.name)
        args = {"iteration": int(row.iteration)}
        nbytes = row.bytes if has_bytes else sizes.get(str(row.name))
        if track == 1 and nbytes is not None and not pd.isna(nbytes):
            args["bytes"] = int(nbytes)
        start, end = _ns(row.start_s), _ns(row.end_s)
        tracks.setdefault((int(row.rank), track), []).append(
            {"name": name, "cat": row.kind, "ph": "X", "ts": start / 1000, "dur": (end - start) / 1000,
             "pid": int(row.rank), "args": args, "_start_ns": start, "_end_ns": end})

    events, threads = [], {}
    for (rank, track), evs in sorted(tracks.items()):
        evs.sort(key=lambda e: (e["_start_ns"], e["_end_ns"]))
        for e, lane in zip(evs, _lanes(evs), strict=True):
            tid = track + 2 * lane  # lane 0: tids 0 and 1 as documented; overflow lanes 2, 3, 4, ...
            threads[(rank, tid)] = TRACKS[track] + (f" {lane + 1}" if lane else "")
            del e["_start_ns"], e["_end_ns"]
            events.append({**e, "tid": tid})
    meta = []
    for rank in shown:
        meta.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, track in enumerate(TRACKS):
            threads.setdefault((rank, tid), track)
    for (rank, tid), name in sorted(threads.items()):
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    other = {"generator": "simfog", "ranks_total": total, "ranks_shown": len(shown), "shown_ranks": shown,
             **dict(metadata or {})}
    if len(shown) < total:
        other["note"] = (f"showing {len(shown)} of {total} ranks ({_ranges(shown)}): Perfetto slows down with "
                         f"thousands of tracks and the file grows with every rank; pick others with --timeline-ranks "
                         f"(simfog simulate) or ranks=[...]")
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def _ranges(ranks: Sequence[int]) -> str:
    """'0-31, 2016-2047' for sorted ranks."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}-{r}" if r != start else f"{r}")
            start = None
    return ", ".join(parts)


def bucket_bytes(result) -> dict[str, int]:
    """Bucket name (as in the intervals: "bucketK", or "fusedK" for Horovod) -> bytes, from `result.buckets`."""
    from simfog import merge

    prefix = "fused" if result.experiment.comm.merge in merge.DYNAMIC else "bucket"
    return {f"{prefix}{b['bucket']}": int(b["bytes"]) for b in result.buckets}


def chrome_trace(result, *, ranks: Sequence[int] | None = None, max_ranks: int = MAX_RANKS) -> dict:
    """The Chrome trace of a simulated Result: at most `max_ranks` ranks unless `ranks` names them (see
    `select_ranks`); args carry each collective's bytes; otherData carries the run's summary. Raises ConfigError
    for ranks outside the run."""
    total = result.experiment.ranks
    shown = select_ranks(total, ranks, max_ranks=max_ranks)
    df = result.intervals()
    summary = result.summary()
    keep = ("model", "batch_size", "ranks", "algorithm", "collective", "merge", "iteration_time_s", "samples_per_s",
            "scaling_efficiency", "estimated", "symmetric_fast_path", "trace")
    return chrome_trace_from_intervals(df, ranks=shown, total_ranks=total, bytes_by_name=bucket_bytes(result),
                                       max_ranks=max_ranks, metadata={k: summary[k] for k in keep if k in summary})


def write_chrome_trace(result, path: str | os.PathLike, ranks: Sequence[int] | None = None, *,
                       max_ranks: int = MAX_RANKS) -> dict:
    """Write `chrome_trace(result)` to `path` atomically (gzipped when it ends in .gz, which Perfetto opens too).
    Returns the trace's otherData (ranks shown, note)."""
    from simfog.files import write_json

    trace = chrome_trace(result, ranks=ranks, max_ranks=max_ranks)
    write_json(path, trace, indent=None)
    return trace["otherData"]
