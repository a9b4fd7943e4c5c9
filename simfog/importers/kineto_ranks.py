"""A folder of PyTorch profiler (Kineto) traces, one file per rank of one run -> one ModelTrace, one NetworkTrace.

The folder is what HTA's TraceAnalysis(trace_dir=...) reads: every `*.json` / `*.json.gz` file in it is one rank,
its rank `distributedInfo.rank`, else the number after "rank" in the file name (rank-3.json, rank3.json.gz).

ModelTrace (import_folder): every rank is imported as `simfog import kineto FILE` imports it, and the ranks must
agree on layers, parameters, batch size and iterations (one run). Their samples are concatenated rank by rank and
`sample_ranks` says whose each is, so the engine gives each simulated rank its own recorded rank's compute and
host time (rank r takes recorded rank r mod R's), iteration by iteration: one simulated iteration replays one
recorded iteration k on every rank, and the ranks differ as the measured ones did in it. Taking the slowest rank
only, or pooling the ranks' samples, would lose that: the fast rank's wait at the collectives would vanish (or
be drawn at random) instead of arising, as measured, from the other rank's longer compute.

Collectives (extra["kineto"]["collectives"], NetworkTrace): the k-th collective issued in the kept iterations of
each rank is the same collective (the ranks must agree on its kind and size). Its transfer time is its end on the
last rank to finish minus its start on the last rank to start, i.e. from the arrival that released it: on one
rank's record (gloo worker annotation, NCCL kernel) the duration also counts the time that rank waited for its
slower peers, which is not transfer. Ranks' clocks are aligned through baseTimeNanoseconds (ts are µs after it),
or taken as absolute when no file has it; ranks on different hosts are only as aligned as their clocks.
"""

from __future__ import annotations

import re
from pathlib import Path

from simfog.errors import ConfigError
from simfog.importers import kineto as kt
from simfog.importers import kineto_events as ke
from simfog.importers.logs import warn
from simfog.trace import DTYPE_BYTES, Layer, ModelTrace, NetworkTrace

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class _Rank:
    """One rank's file: its data, parsed events, rank number and clock offset (µs, to the folder's time base)."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.data = ke.load(self.path)
        self.trace = ke.Trace(self.data, self.path)
        info = self.data.get("distributedInfo") or {}
        rank = info.get("rank") if isinstance(info, dict) else None
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            m = _RANK_IN_NAME.search(path.name)
            if m is None:
                raise ConfigError("distributedInfo.rank", "(missing)", "the rank in distributedInfo, or a file name "
                                  "with it (rank-3.json)", source=self.path)
            rank = int(m.group(1))
        self.rank = rank
        self.info = info if isinstance(info, dict) else {}
        base = self.data.get("baseTimeNanoseconds")
        self.base_ns = base if isinstance(base, int) and not isinstance(base, bool) else None
        self.offset_us = 0.0


def _ranks(folder: str) -> list[_Rank]:
    root = Path(folder)
    paths = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not paths:
        raise ConfigError("folder", folder, "a folder with one Kineto trace (.json or .json.gz) per rank")
    ranks = sorted((_Rank(p) for p in paths), key=lambda r: r.rank)
    for a, b in zip(ranks, ranks[1:], strict=False):
        if a.rank == b.rank:
            raise ConfigError("rank", a.rank, f"one file per rank ({Path(a.path).name} and {Path(b.path).name} "
                              "are both this rank)", source=folder)
    bases = {r.base_ns is None for r in ranks}
    if len(bases) > 1:
        raise ConfigError("baseTimeNanoseconds", "(in some files only)", "the same time convention in every rank's "
                          "file, so that their clocks can be aligned", source=folder)
    world = ranks[0].info.get("world_size")
    if isinstance(world, int) and len(ranks) < world:
        warn(folder, f"the folder has {len(ranks)} of the run's {world} ranks: a collective's last arrival among "
             "them need not be the one that released it, so its times may still include waiting for the absent "
             "ranks, and the model trace has only these ranks' compute")
    if ranks[0].base_ns is not None:
        first = min(r.base_ns for r in ranks)
        for r in ranks:
            r.offset_us = (r.base_ns - first) / 1000
    return ranks


def _hosts(ranks: list[_Rank]) -> list[str] | None:
    names = [r.data.get("host_name") for r in ranks]
    return sorted(set(names)) if all(isinstance(n, str) and n for n in names) else None


def import_folder(folder, *, model=None, batch_size=None, clock="auto", skip=0, step_time=None) -> ModelTrace:
    """Every rank's trace in `folder` -> one ModelTrace with each rank's samples (sample_ranks) and the collectives
    timed across ranks. Options as import_kineto. Raises ConfigError naming the file or folder for a bad file,
    two files of one rank, or ranks that disagree (layers, parameters, batch size, iterations, collectives)."""
    folder = str(folder)
    step_s = kt.check_options(folder, clock=clock, skip=skip, step_time=step_time)
    ranks = _ranks(folder)
    name = Path(folder).name
    mts = [kt.import_loaded(r.path, r.data, r.trace, model=model or name, batch_size=batch_size, clock=clock,
                            skip=skip, step_s=step_s) for r in ranks]
    first, ref = ranks[0], mts[0]
    for r, mt in zip(ranks[1:], mts[1:], strict=True):
        for field, mine, theirs in (
                ("layers", [layer.name for layer in mt.layers], [layer.name for layer in ref.layers]),
                ("parameters", [layer.params for layer in mt.layers], [layer.params for layer in ref.layers]),
                ("grad_ready_order", mt.grad_ready_order, ref.grad_ready_order),
                ("batch_size", mt.batch_size, ref.batch_size), ("iterations", mt.samples, ref.samples)):
            if mine != theirs:
                shown = mine if field in ("batch_size", "iterations") else f"(differs from rank {first.rank}'s)"
                raise ConfigError(field, shown, f"rank {first.rank}'s ({Path(first.path).name}): the ranks of one "
                                  "data-parallel run", source=r.path)
    layers = tuple(Layer(layer.name, tuple(t for mt in mts for t in mt.layers[i].forward_s),
                         tuple(t for mt in mts for t in mt.layers[i].backward_s), layer.params)
                   for i, layer in enumerate(ref.layers))
    rows = _matched(folder, ranks, skip)
    k0 = ref.extra["kineto"]
    hosts = _hosts(ranks)
    timed = [c for c in rows if c["duration_s"] is not None]
    waited = sum(max(c["wait_s"]) for c in timed)
    extra = {"kineto": {
        **{key: k0[key] for key in ("backend", "world_size", "host_devices", "clock", "attribution", "params_from")},
        "file": name, "files": [Path(r.path).name for r in ranks], "ranks": [r.rank for r in ranks],
        "hosts": hosts,
        "iterations": _iterations(ranks, mts, skip),
        "buckets": k0["buckets"], "collectives": rows}}
    notes = (f"Imported by `simfog import kineto {name}` from {len(ranks)} rank traces "
             f"({', '.join(f'{Path(r.path).name}: rank {r.rank}' for r in ranks)}), {ref.samples} iterations each. "
             "Samples: every rank's, rank by rank (sample_ranks); the simulator gives each simulated rank its own "
             "recorded rank's compute and host time, one recorded iteration on every rank at once. Collectives: "
             f"matched across ranks in issue order; {len(timed)} of {len(rows)} timed, their duration the transfer "
             "time across ranks (end on the last rank to finish minus start on the last rank to start), leaving "
             f"out {waited * 1e3:.3g} ms of waiting for slower peers in all. "
             + " ".join(f"Rank {r.rank}: {mt.provenance.notes}" for r, mt in zip(ranks, mts, strict=True)))
    return ModelTrace(
        model=ref.model, batch_size=ref.batch_size, dtype=ref.dtype, device=ref.device, software=ref.software,
        provenance=type(ref.provenance)(command=f"torch.profiler traces in {name}", date=ref.provenance.date,
                                        host=", ".join(hosts) if hosts else ref.provenance.host,
                                        source="imported", estimated=False, notes=notes),
        layers=layers, grad_ready_order=ref.grad_ready_order,
        optimizer_s=tuple(t for mt in mts for t in mt.optimizer_s), extra=extra,
        host_s=tuple(t for mt in mts for t in mt.host_s),
        sample_ranks=tuple(r.rank for r, mt in zip(ranks, mts, strict=True) for _ in range(mt.samples)))


def _iterations(ranks: list[_Rank], mts: list[ModelTrace], skip: int) -> list[dict]:
    """Every rank's iterations (as a single-file import lists them) with its rank and start_s: seconds from the
    earliest start of a kept iteration on any rank (clocks aligned), so the run's span can be read off."""
    starts = [[s + r.offset_us for _, s, _ in r.trace.windows(r.trace.main_thread())[skip:]] for r in ranks]
    t0 = min(s[0] for s in starts)
    return [dict(it, rank=r.rank, start_s=round((s - t0) * 1e-6, 9))
            for r, mt, mine in zip(ranks, mts, starts, strict=True)
            for it, s in zip(mt.extra["kineto"]["iterations"], mine, strict=True)]


def import_folder_comm(folder, *, nodes=None, skip=0) -> NetworkTrace:
    """The collectives of every rank's trace in `folder` -> NetworkTrace, each sample a transfer time across ranks.
    `nodes`: by default the number of distinct host names in the traces. Raises ConfigError as import_folder."""
    folder = str(folder)
    kt.check_options(folder, skip=skip)
    ranks = _ranks(folder)
    rows = _matched(folder, ranks, skip)
    first = ranks[0]
    iterations = len(first.trace.windows(first.trace.main_thread())) - skip
    hosts = _hosts(ranks)
    try:
        return kt._network(Path(folder).name, rows, first.info.get("backend"), [r.rank for r in ranks],
                           first.info.get("world_size"), len(first.data.get("deviceProperties") or []), nodes,
                           kt._date(first.data, first.trace), ", ".join(hosts) if hosts else "unknown", iterations,
                           hosts=len(hosts) if hosts else None)
    except ConfigError as e:
        raise e.in_file(folder) from None


def _kept(r: _Rank, skip: int) -> list[tuple[int, ke.Collective]]:
    """(iteration, collective) for the collectives rank `r` issued in its iterations after the first `skip`."""
    windows = r.trace.windows(r.trace.main_thread())
    if skip >= len(windows):
        raise ConfigError("skip", skip, f"fewer than the {len(windows)} iterations in the trace", source=r.path)
    out = []
    for c in ke.collectives(r.trace):
        k = next((k for k, (_, s, e) in enumerate(windows[skip:]) if s <= c.issue.ts <= e), None)
        if k is not None:
            out.append((k, c))
    return out


def _matched(folder: str, ranks: list[_Rank], skip: int) -> list[dict]:
    """One row per collective of the run: the k-th collective of every rank, its transfer time across ranks
    (seconds, None when a rank has no execution record of it) and each rank's wait for the last arrival."""
    kept = [_kept(r, skip) for r in ranks]
    for r, mine in zip(ranks[1:], kept[1:], strict=True):
        if len(mine) != len(kept[0]):
            raise ConfigError("collectives", len(mine), f"{len(kept[0])}, as rank {ranks[0].rank}: every rank "
                              "issues the same collectives in one run", source=r.path)
    rows = []
    for j, group in enumerate(zip(*kept, strict=True)):
        (k, c0) = group[0]
        for r, (_, c) in zip(ranks[1:], group[1:], strict=True):
            if (c.collective, c.elements) != (c0.collective, c0.elements):
                raise ConfigError(f"collective #{j}", f"{c.collective} of {c.elements} elements",
                                  f"{c0.collective} of {c0.elements} elements, as rank {ranks[0].rank}: the ranks "
                                  "issue the same collectives in the same order", source=r.path)
        dtype = next((c.dtype for _, c in group if c.dtype), None)
        row = {"iteration": k, "collective": c0.collective, "elements": c0.elements, "dtype": dtype,
               "bytes": c0.elements * DTYPE_BYTES[dtype] if c0.elements and dtype in DTYPE_BYTES else None,
               "group_size": c0.group_size, "duration_s": None, "wait_s": None, "released_by": None}
        if all(c.start_us is not None and c.duration_us is not None for _, c in group):
            starts = [c.start_us + r.offset_us for r, (_, c) in zip(ranks, group, strict=True)]
            last = max(starts)
            end = max(s + c.duration_us for s, (_, c) in zip(starts, group, strict=True))
            row.update(duration_s=round(max(0.0, end - last) * 1e-6, 9),
                       wait_s=[round((last - s) * 1e-6, 9) for s in starts],
                       released_by=ranks[starts.index(last)].rank)
        rows.append(row)
    return rows
