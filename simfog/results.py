"""Results: per-rank, per-iteration intervals as pandas DataFrames, and the summary users read.

Interval kinds: forward, backward, optimizer (compute stream); comm (a collective running on the rank's
communication stream); wait (the rank launched a collective whose peers had not all arrived).
Per rank and iteration: compute_s (forward + backward + optimizer), comm_s (collective time), comm_exposed_s
(collective time after backward ended, which the optimizer step waited for), idle_s (the rest of the wait after
backward: neither computing nor communicating, e.g. waiting for a straggler).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

INTERVAL_COLUMNS = ["rank", "iteration", "kind", "name", "start_s", "end_s"]
# The paths a run may take (Result.path): the event engine, a family's closed form, or the dataflow family's
# evaluation in time order under comm.p2p_sharing = "fluid".
PATH_EVENTS, PATH_ANALYTIC, PATH_FLUID = "events", "analytic", "fluid"


ITERATION_COLUMNS = ["rank", "iteration", "start_s", "end_s", "iteration_s", "compute_s", "forward_s", "backward_s",
                     "optimizer_s", "comm_s", "comm_exposed_s", "idle_s", "wait_s"]


@dataclass
class Result:
    """What a run gives. Every path fills `columns`, per (rank, iteration) numpy arrays (simulated ranks, iterations)
    of the ITERATION_COLUMNS it computes: the closed forms (simfog.algorithms) from their recurrence, the event
    engine from its records (simfog.span_log). The per-interval `records` are built only when `intervals()` asks
    (`make_records`); a Result made from records alone (a measured run, validate) computes its columns from them
    when first asked. `path` names the path taken: "events", "analytic" or "fluid". pandas is imported only by the
    methods that return frames. A simulated run's Result is built in one place, simfog.simulation.Simulation.result."""

    experiment: object
    records: list | None
    symmetric: bool
    single_rank_time_s: float
    buckets: list = field(default_factory=list)
    events: int = 0
    wall_s: float = 0.0
    mixing: dict | None = None  # how well models agree (decentralized algorithms): see summary()
    memory: object = None       # simfog.memory.Memory per rank, when known
    columns: dict | None = None  # name -> (simulated ranks, iterations) float array
    path: str = PATH_EVENTS
    make_records: Callable[[], list] | None = field(default=None, repr=False)
    make_columns: Callable[[], dict] | None = field(default=None, repr=False)  # columns only frames need
    # the prediction interval's summary keys (simfog.run_bands.summary_fields), once computed
    interval: dict | None = None
    # what the numbers rest on (simfog.caveats.attach: errors.Caveat), once gathered: the summary's "warnings"
    caveats: tuple | None = None

    def _records(self) -> list:
        if self.records is None:
            self.records = self.make_records() if self.make_records is not None else []
        return self.records

    def interval_records(self) -> list:
        """Every recorded interval as a (rank, iteration, kind, name, start_s, end_s) tuple, in record order; on the
        symmetric fast path rank 0's only."""
        return self._records()

    def intervals(self) -> pd.DataFrame:
        """Every interval of every rank: columns rank, iteration, kind, name, start_s, end_s. On the symmetric
        fast path rank 0 was simulated and stands for every rank."""
        import pandas as pd

        df = pd.DataFrame.from_records(self._records(), columns=INTERVAL_COLUMNS)
        if self.symmetric and self.experiment.ranks > 1:
            n = self.experiment.ranks
            df = df.loc[df.index.repeat(n)].reset_index(drop=True)
            df["rank"] = np.tile(np.arange(n), len(df) // n)
            df = df.sort_values(["rank", "iteration", "start_s"], kind="stable").reset_index(drop=True)
        return df

    def iterations(self) -> pd.DataFrame:
        """One row per simulated rank and iteration: start_s, end_s, iteration_s, compute_s, comm_s,
        comm_exposed_s, idle_s, wait_s (seconds)."""
        import pandas as pd

        return pd.DataFrame(self._column_frame())[ITERATION_COLUMNS]

    def _columns(self) -> dict:
        """The per (rank, iteration) columns; from the records when the Result was made from records alone."""
        if self.columns is None:
            from simfog.span_log import SpanLog, iteration_columns

            log = SpanLog.of(self._records())
            self.columns = iteration_columns(log, *log.shape())
        return self.columns

    def _column_frame(self) -> dict:
        """The columns flattened rank-major (the row order of iterations()), with the derived ones."""
        self._columns()
        if self.make_columns is not None:
            self.columns = {**self.columns, **self.make_columns()}
            self.make_columns = None
        cols = self.columns
        n, iters = cols["end_s"].shape
        flat = {k: np.ascontiguousarray(v).ravel() for k, v in cols.items()}
        flat["rank"] = np.repeat(np.arange(n, dtype=np.int64), iters)
        flat["iteration"] = np.tile(np.arange(iters, dtype=np.int64), n)
        flat["compute_s"] = flat["forward_s"] + flat["backward_s"] + flat["optimizer_s"]
        flat["iteration_s"] = flat["end_s"] - flat["start_s"]
        return flat

    def _stats(self) -> tuple:
        """(per-iteration ends over ranks, means of compute_s, comm_s, comm_exposed_s, idle_s per (rank, iteration))."""
        cols = self._columns()
        ends = cols["end_s"].max(axis=0)  # iteration k ends when the last rank has finished its optimizer step
        flat = {k: np.ascontiguousarray(cols[k]).ravel() for k in ("forward_s", "backward_s", "optimizer_s", "comm_s",
                                                                    "comm_exposed_s", "idle_s")}
        flat["compute_s"] = flat["forward_s"] + flat["backward_s"] + flat["optimizer_s"]
        means = [float(flat[k].sum() / flat[k].size) for k in ("compute_s", "comm_s", "comm_exposed_s", "idle_s")]
        return ends, *means

    def summary(self) -> dict:
        """The numbers of `simfog simulate --json` (seconds, samples/s, fractions); `path` names how the run was
        simulated: "analytic" (a family's closed form, schedules fixed before the run), "fluid" or "events" (the event
        engine). With `interval` set (simfog.run_bands.attach): the interval's keys too; with `caveats` set
        (simfog.caveats.attach), "warnings": [{"code", "text"}, ...]."""
        exp = self.experiment
        ends, compute_s, comm_s, exposed, idle_s = self._stats()
        per_iteration = np.diff(np.concatenate([[0.0], ends]))
        t_iter = float(per_iteration.mean())
        batch = exp.workload.trace.batch_size
        return {
            "model": exp.workload.trace.model,
            "batch_size": batch,
            "ranks": exp.ranks,
            "nodes": exp.cluster.nodes,
            "gpus_per_node": exp.cluster.ranks_per_node,
            "algorithm": exp.comm.algorithm,
            "collective": exp.comm.collective,
            "merge": exp.comm.merge,
            "buckets": len(self.buckets),
            "bytes_per_iteration": int(exp.workload.trace.nbytes),
            "iterations": exp.iterations,
            "seed": exp.seed,
            "compute_mode": exp.workload.compute,
            "compute_source": exp.workload.compute_source(),
            "iteration_time_s": t_iter,
            "iteration_time_max_s": float(per_iteration.max()),
            "samples_per_s": exp.ranks * batch / t_iter,
            "scaling_efficiency": self.single_rank_time_s / t_iter,
            "compute_s": compute_s,
            "comm_s": comm_s,
            "comm_exposed_s": exposed,
            "idle_s": idle_s,
            "overlap_fraction": 1.0 - exposed / comm_s if comm_s > 0 else 1.0,
            "estimated": bool(exp.estimated),
            "symmetric_fast_path": self.symmetric,
            "path": self.path,
            "trace": exp.workload.trace_path,
            "network_trace": exp.network_trace,
            "network_file": exp.network.path if getattr(exp, "network", None) is not None else None,
            **({"transport": exp.transport} if getattr(exp, "transport", None) else {}),
            **_overhead_fields(exp),
            **_variation_fields(exp),
            **_mixing_fields(self.mixing),
            **(self.memory.summary() if self.memory is not None else {}),
            **(self.interval or {}),
            **({"warnings": [{"code": c.code, "text": c.text} for c in self.caveats]}
               if self.caveats is not None else {}),
        }


def _overhead_fields(exp) -> dict:
    """Costs beyond the wire (simfog.overheads): bucket_copy_Bps, collective_overhead_s, overlap_slowdown, each
    with `<name>_source`: "experiment file", "measured on <device> by the collector (...)" or "unmeasured: 0"."""
    overheads = getattr(exp, "overheads", None)
    return overheads().summary() if callable(overheads) else {}


def _variation_fields(exp) -> dict:
    """Per-call variation (simfog.variation), only where a link has a spread: each class's spread and how the run
    evaluated it ("draw" or "expected")."""
    c = exp.cluster
    if not (c.nic.spread or c.intra.spread):
        return {}
    return {"nic_spread": c.nic.spread, "intra_spread": c.intra.spread, "variation": exp.comm.variation}


MIXING_FIELDS = ("topology", "spectral_gap", "iterations_to_consensus", "consensus_eps",
                 "averaging_rounds_per_iteration")


def _mixing_fields(mixing: dict | None) -> dict:
    """The mixing quality of the run's algorithm (None each where it has none, e.g. allreduce): the averaging
    graph, its spectral gap (1 = exact average within one period, 0 = never mixes), how many iterations its
    averaging needs to bring the disagreement between models down to `consensus_eps` of what it was, and, for
    asynchronous algorithms, how many averaging rounds ran per training iteration."""
    mixing = mixing or {}
    return {key: mixing.get(key) for key in MIXING_FIELDS}
