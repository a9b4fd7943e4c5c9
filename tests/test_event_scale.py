"""The event engine's speed-ups (issue 14) change no bit: iteration times pinned from the code before them, and the
numpy summary of the engine's records (simfog.span_log) equal to the pandas one it replaced.

PINNED holds summary numbers (float.hex) that the code before the change computed for the configurations of
CONFIGS: algorithms only the event engine runs (horovod's cycles, 2 streams, WAGMA, async) and win_put (then on the
event engine) with stragglers, slowdowns and sampled compute. `python -m tests.test_event_scale` prints them for
the code on PYTHONPATH (how they were made).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simfog.experiment import Heterogeneity
from simfog.simulation import simulate
from tests.conftest import REPO, make_experiment, make_trace

PINNED_FIELDS = ("iteration_time_s", "iteration_time_max_s", "compute_s", "comm_s", "comm_exposed_s", "idle_s",
                 "scaling_efficiency")
HETERO = Heterogeneity(straggler_rate=0.3, straggler_delay_s=3e-3, rank_slowdown=((3, 1.4),),
                       node_slowdown=((1, 1.1),))


def _trace():
    rng = np.random.default_rng(5)
    n = 12
    fwd, bwd = rng.uniform(1e-3, 4e-3, n), rng.uniform(1e-3, 8e-3, n)
    elems = rng.integers(1, 3_000_000, n)
    rows = [(list(fwd * rng.uniform(0.7, 1.6, n)), list(bwd * rng.uniform(0.7, 1.6, n))) for _ in range(5)]
    return make_trace(fwd, bwd, elems, samples=rows, optimizer=9e-4)


def _synthetic(iterations=3, **comm):
    exp = make_experiment(_trace(), nodes=4, gpus_per_node=4, compute="samples", iterations=iterations, seed=7,
                          collective="ring", **comm)
    return replace(exp, heterogeneity=HETERO)


# The default experiment as it was when the numbers below were pinned (it now names a shipped cluster): 8-GPU nodes
# on 25 Gbit/s links, so that these numbers stay what the engine gave before its speed-ups.
PINNED_CLUSTER = {"nodes": 4, "gpus_per_node": 8, "intra_bandwidth": "150GB/s", "intra_latency": "2us",
                  "nic_bandwidth": "25Gbit/s", "nic_latency": "10us", "gpu_memory": "80GB"}


def _shipped(trace: str, compute: str, ranks: int, iterations=2, **comm):
    """The bench's experiment (bench/scale.py child) as it was pinned: the default's workload with a shipped trace,
    on PINNED_CLUSTER."""
    import tomllib

    from simfog import experiment
    from simfog.cli import DEFAULT_EXPERIMENT
    from simfog.trace import load_model_trace

    doc = tomllib.loads(DEFAULT_EXPERIMENT.read_text())
    exp = experiment.from_dict({**doc, "cluster": PINNED_CLUSTER}, base_dir=DEFAULT_EXPERIMENT.parent)
    path = REPO / "traces" / {"resnet50": "resnet50-cpu-b32.json.gz", "gpt2": "gpt2-cpu-b8.json.gz"}[trace]
    exp = replace(exp, iterations=iterations, workload=replace(exp.workload, trace=load_model_trace(path),
                                                               trace_path=str(path), compute=compute))
    return exp.with_ranks(ranks).with_comm(collective="ring", **comm)


CONFIGS = {
    "horovod": lambda: _synthetic(merge="horovod", cycle_time_s=2e-3, threshold_bytes=6e6),
    "horovod_overheads": lambda: _synthetic(merge="horovod", cycle_time_s=1e-3, threshold_bytes=4e6,
                                            bucket_copy_Bps=5e9, collective_overhead_s=40e-6, overlap_slowdown=1.2),
    "streams2": lambda: _synthetic(merge="ddp", threshold_bytes=5e6, streams=2),
    "wagma": lambda: _synthetic(algorithm="wagma", group_size=4, global_every=2, iterations=4),
    "wagma_blocking": lambda: _synthetic(algorithm="wagma", group_size=4, wait_for_group=True, group_collective=True),
    "win_put": lambda: _synthetic(algorithm="win_put"),
    "win_put_negotiate": lambda: _synthetic(algorithm="win_put", negotiate=True, topology="ring"),
    "async": lambda: _synthetic(algorithm="async", async_period_s=4e-3, iterations=4),
    "resnet50_horovod": lambda: _shipped("resnet50", "samples", 64, algorithm="allreduce", merge="horovod",
                                         threshold_bytes=25 * 2**20),
    "resnet50_wagma": lambda: _shipped("resnet50", "samples", 64, algorithm="wagma"),
    "resnet50_win_put": lambda: _shipped("resnet50", "samples", 64, algorithm="win_put"),
    "resnet50_async": lambda: _shipped("resnet50", "samples", 64, algorithm="async"),
    "gpt2_horovod": lambda: _shipped("gpt2", "mean", 32, algorithm="allreduce", merge="horovod",
                                     threshold_bytes=25 * 2**20),
    "gpt2_win_put": lambda: _shipped("gpt2", "mean", 32, algorithm="win_put"),
}

PINNED: dict[str, dict[str, str]] = {  # the code before issue 14's speed-ups (commit 04cf04d)
    'horovod': {
        'iteration_time_s': '0x1.5fdf9c075d169p-3',
        'iteration_time_max_s': '0x1.6b4d22f375022p-3',
        'compute_s': '0x1.b84bf69bd77a3p-4',
        'comm_s': '0x1.d30d7c1d0f8ddp-4',
        'comm_exposed_s': '0x1.070527b9d4091p-4',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.3d8a13a0bbe15p-1',
    },
    'horovod_overheads': {
        'iteration_time_s': '0x1.a25c8b994dec7p-3',
        'iteration_time_max_s': '0x1.ac6c8c0927096p-3',
        'compute_s': '0x1.f30871849f398p-4',
        'comm_s': '0x1.26d1261885974p-3',
        'comm_exposed_s': '0x1.51428bf4edf57p-4',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.0b1310ae38a06p-1',
    },
    'streams2': {
        'iteration_time_s': '0x1.63998cc6b9ad9p-3',
        'iteration_time_max_s': '0x1.6ba1cfa65379fp-3',
        'compute_s': '0x1.b84bf69bd77a3p-4',
        'comm_s': '0x1.b591123bc2840p-3',
        'comm_exposed_s': '0x1.0e7909388d371p-4',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.3a363cf38f8dfp-1',
    },
    'wagma': {
        'iteration_time_s': '0x1.5255986bc75cfp-2',
        'iteration_time_max_s': '0x1.092d23b0b2caap-1',
        'compute_s': '0x1.b9a224a09bb53p-4',
        'comm_s': '0x1.e58036d3700f0p-3',
        'comm_exposed_s': '0x1.c7940ac6ee03ap-3',
        'idle_s': '0x1.cca1aed5bdf00p-15',
        'scaling_efficiency': '0x1.4afb08cce9d2ep-2',
    },
    'wagma_blocking': {
        'iteration_time_s': '0x1.cf506e702c0e0p-3',
        'iteration_time_max_s': '0x1.9803d01c048dep-2',
        'compute_s': '0x1.b84bf69bd77a3p-4',
        'comm_s': '0x1.e59316aa04dbbp-4',
        'comm_exposed_s': '0x1.91738b26e276dp-4',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.e252d63fed656p-2',
    },
    'win_put': {
        'iteration_time_s': '0x1.6141e0d2e6337p-1',
        'iteration_time_max_s': '0x1.62cc050e54629p-1',
        'compute_s': '0x1.b84bf69bd77a3p-4',
        'comm_s': '0x1.4bbe38db1ee75p-1',
        'comm_exposed_s': '0x1.25e995558d11cp-1',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.3c4ba0d04346bp-3',
    },
    'win_put_negotiate': {
        'iteration_time_s': '0x1.477e0bc34006cp-3',
        'iteration_time_max_s': '0x1.4da69cb0f8c33p-3',
        'compute_s': '0x1.b84bf69bd77a3p-4',
        'comm_s': '0x1.e8f13416ff3c3p-5',
        'comm_exposed_s': '0x1.9fa4a5a172f60p-6',
        'idle_s': '0x1.ee173dfa5d1b5p-8',
        'scaling_efficiency': '0x1.552df307c95d4p-1',
    },
    'async': {
        'iteration_time_s': '0x1.2b9142b01bcb8p-3',
        'iteration_time_max_s': '0x1.32a2163ab9f52p-3',
        'compute_s': '0x1.b9a224a09bb54p-4',
        'comm_s': '0x1.ac93ce9c8321cp-4',
        'comm_exposed_s': '0x0.0p+0',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.75d00d8a31e4fp-1',
    },
    'resnet50_horovod': {
        'iteration_time_s': '0x1.32f3ab9614e18p+3',
        'iteration_time_max_s': '0x1.32f3d80327b00p+3',
        'compute_s': '0x1.fddb6f8195fc0p+2',
        'comm_s': '0x1.98029b25e3db0p-3',
        'comm_exposed_s': '0x1.7b080e8d50a60p-6',
        'idle_s': '0x1.8f178869281e6p+0',
        'scaling_efficiency': '0x1.a9397796eaa94p-1',
    },
    'resnet50_wagma': {
        'iteration_time_s': '0x1.32e83f58fdc00p+3',
        'iteration_time_max_s': '0x1.32e83f58fdc00p+3',
        'compute_s': '0x1.fddb6f8195fc0p+2',
        'comm_s': '0x1.930ae8159c828p-2',
        'comm_exposed_s': '0x0.0p+0',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.a9494b2a5325ap-1',
    },
    'resnet50_win_put': {
        'iteration_time_s': '0x1.32e83f58fdc00p+3',
        'iteration_time_max_s': '0x1.32e83f58fdc00p+3',
        'compute_s': '0x1.fddb6f8195fc0p+2',
        'comm_s': '0x1.03a61628b0285p+0',
        'comm_exposed_s': '0x0.0p+0',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.a9494b2a5325ap-1',
    },
    'resnet50_async': {
        'iteration_time_s': '0x1.32e83f58fdc00p+3',
        'iteration_time_max_s': '0x1.32e83f58fdc00p+3',
        'compute_s': '0x1.fddb6f8195fc0p+2',
        'comm_s': '0x1.e30a0057e2173p-1',
        'comm_exposed_s': '0x0.0p+0',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.a9494b2a5325ap-1',
    },
    'gpt2_horovod': {
        'iteration_time_s': '0x1.63101eab7a9d2p+2',
        'iteration_time_max_s': '0x1.6314ef37b3242p+2',
        'compute_s': '0x1.5cdf7f04b88cdp+2',
        'comm_s': '0x1.62bebc54e3c00p-2',
        'comm_exposed_s': '0x1.8a9d607730de0p-4',
        'idle_s': '0x1.8a89395338000p-12',
        'scaling_efficiency': '0x1.f712f9edb25aep-1',
    },
    'gpt2_win_put': {
        'iteration_time_s': '0x1.7140bc1ef3e1bp+2',
        'iteration_time_max_s': '0x1.7140bc1ef3e1bp+2',
        'compute_s': '0x1.5cdf7f04b88cep+2',
        'comm_s': '0x1.d50278e650c38p+1',
        'comm_exposed_s': '0x1.4613d1a3b54e0p-2',
        'idle_s': '0x0.0p+0',
        'scaling_efficiency': '0x1.e3bddcaf12da8p-1',
    },
}


def pinned(name: str) -> dict[str, str]:
    s = simulate(CONFIGS[name](), symmetric=False).summary()
    return {k: float(s[k]).hex() for k in PINNED_FIELDS}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pinned_iteration_times(name):
    assert pinned(name) == PINNED[name]


# --- the pandas summary the numpy one replaced (simfog.results before issue 14), kept as the reference ---------------

INTERVAL_COLUMNS = ["rank", "iteration", "kind", "name", "start_s", "end_s"]
ITERATION_COLUMNS = ["rank", "iteration", "start_s", "end_s", "iteration_s", "compute_s", "forward_s", "backward_s",
                     "optimizer_s", "comm_s", "comm_exposed_s", "idle_s", "wait_s"]


def _union_after_backward(comm: pd.DataFrame) -> pd.Series:
    w = pd.DataFrame({"rank": comm["rank"], "iteration": comm["iteration"],
                      "s": comm[["start_s", "bwd_end"]].max(axis=1), "e": comm[["end_s", "opt_start"]].min(axis=1)})
    w = w[w.e > w.s].sort_values(["rank", "iteration", "s"], kind="stable")
    keys = [w["rank"], w["iteration"]]
    covered = w.groupby(keys)["e"].cummax().groupby(keys).shift(fill_value=-np.inf)
    part = (w.e - np.maximum(w.s, covered)).clip(lower=0)
    return part.groupby(keys).sum()


def pandas_iterations(records) -> pd.DataFrame:
    df = pd.DataFrame.from_records(records, columns=INTERVAL_COLUMNS)
    df = df.sort_values(["rank", "iteration"], kind="stable", ignore_index=True)
    dur = df["end_s"] - df["start_s"]
    keys = ["rank", "iteration"]
    g = df.assign(dur=dur).groupby(keys)
    out = pd.DataFrame({"start_s": g["start_s"].min(), "end_s": g["end_s"].max()})
    for kind in ("forward", "backward", "optimizer", "comm", "wait"):
        out[f"{kind}_s"] = df[df.kind == kind].assign(d=dur).groupby(keys)["d"].sum()
    out = out.fillna(0.0)
    bwd_end = df[df.kind == "backward"].groupby(keys)["end_s"].max()
    opt_start = df[df.kind == "optimizer"].groupby(keys)["start_s"].min()
    comm = df[df.kind == "comm"].join(bwd_end.rename("bwd_end"), on=keys)
    comm = comm.join(opt_start.rename("opt_start"), on=keys)
    out["comm_exposed_s"] = _union_after_backward(comm)
    out = out.fillna(0.0)
    out["compute_s"] = out.forward_s + out.backward_s + out.optimizer_s
    out["iteration_s"] = out.end_s - out.start_s
    exposed = (opt_start - bwd_end).reindex(out.index).fillna(0.0)
    out["idle_s"] = (exposed - out.comm_exposed_s).clip(lower=0)
    return out.reset_index()[ITERATION_COLUMNS]


def pandas_stats(it: pd.DataFrame) -> tuple:
    ends = it.groupby("iteration")["end_s"].max().to_numpy()
    return ends, float(it.compute_s.mean()), float(it.comm_s.mean()), float(it.comm_exposed_s.mean()), \
        float(it.idle_s.mean())


def assert_bits(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal frames, floats bit for bit (-0.0 is not 0.0)."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        assert x.dtype == y.dtype, c
        assert np.array_equal(x.view(np.int64), y.view(np.int64)), c


# The event engine on every kind of algorithm (path="events" where the analytic path would take it): static merges
# with overheads, several streams, the sharded algorithms (pieces of backward and optimizer, waits), the dataflow
# ones (waits between messages), besides CONFIGS.
EVENT_GRID = {
    **CONFIGS,
    "ddp_overheads": lambda: _synthetic(merge="ddp", threshold_bytes=4e6, bucket_copy_Bps=4e9,
                                        collective_overhead_s=30e-6, overlap_slowdown=1.3),
    "wfbp_streams3": lambda: _synthetic(merge="wfbp", streams=3),
    "fsdp": lambda: _synthetic(algorithm="fsdp", prefetch=2),
    "hsdp": lambda: _synthetic(algorithm="hsdp", reshard_after_forward=False),
    "zero2_overlap": lambda: _synthetic(algorithm="zero2", overlap_comm=True, reduce_bucket_size=1_000_000),
    "zero3": lambda: _synthetic(algorithm="zero3", reduce_bucket_size=1_500_000),
    "neighbor": lambda: _synthetic(algorithm="neighbor"),
    "hierarchical_neighbor": lambda: _synthetic(algorithm="hierarchical_neighbor"),
    "decentralized": lambda: _synthetic(algorithm="decentralized", buffered_sends=True),
    "powersgd": lambda: _synthetic(algorithm="powersgd"),
    "wagma_global": lambda: _synthetic(algorithm="wagma", group_size=2, global_every=3, global_collective=True),
}


@pytest.mark.parametrize("name", sorted(EVENT_GRID))
def test_numpy_summary_equals_pandas(name):
    result = simulate(EVENT_GRID[name](), symmetric=False, path="events")
    assert result.path == "events"
    want = pandas_iterations(result._records())
    assert_bits(result.iterations(), want)
    ends, *means = result._stats()
    want_ends, *want_means = pandas_stats(want)
    assert np.array_equal(ends, want_ends) and [m.hex() for m in means] == [m.hex() for m in want_means]


def test_numpy_summary_of_overlapping_and_unsorted_intervals():
    """Records out of time order, comm intervals overlapping (ends not in order) and reaching outside the window,
    a group without backward, pieces of backward: the union and sums as pandas took them."""
    from simfog.span_log import SpanLog, iteration_columns

    rng = np.random.default_rng(3)
    rows = []
    for r in range(6):
        for it in range(3):
            t0 = it * 10.0 + rng.uniform(0, 1)
            rows.append((r, it, "forward", "forward", t0, t0 + 1))
            if (r, it) != (2, 1):
                rows += [(r, it, "backward", "backward", t0 + 1, t0 + 2), (r, it, "backward", "b2", t0 + 2, t0 + 3)]
            for _ in range(rng.integers(0, 7)):
                s = t0 + rng.uniform(0, 6)
                rows.append((r, it, "comm", "c", s, s + rng.uniform(0, 3)))
                if rng.random() < 0.5:
                    rows.append((r, it, "wait", "c", s - 0.1, s))
            rows.append((r, it, "optimizer", "optimizer", t0 + 5, t0 + 6))
    rng.shuffle(rows)
    want = pandas_iterations(rows)
    log = SpanLog.of(rows)
    cols = iteration_columns(log, 6, 3)
    for c in ("start_s", "end_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "comm_exposed_s", "idle_s",
              "wait_s"):
        assert np.array_equal(cols[c].ravel().view(np.int64), want[c].to_numpy().view(np.int64)), c


def test_split_rounds_is_split_by_iteration_for_every_rank():
    """BAGUA async's round, cut for every rank at once, gives split_by_iteration's pieces rank by rank, also where
    rounds start or end exactly on an iteration's start and where iterations take no time."""
    from simfog.algorithms.dynamic.plan import split_by_iteration, split_rounds

    rng = np.random.default_rng(1)
    for trial in range(300):
        n, iters = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        known = rng.integers(0, iters + 1, n)
        table = np.full((n, iters + 1), np.inf)
        table[:, 0] = 0.0
        for r in range(n):
            steps = rng.choice([0.0, 0.5, 1.0, 1.7], known[r])
            table[r, 1:known[r] + 1] = np.cumsum(steps)
        grid = np.unique(table[np.isfinite(table)])
        s, e = sorted(rng.choice(np.concatenate([grid, rng.uniform(0, 6, 3)]), 2))
        want = [(r, j, a, b) for r in range(n)
                for j, a, b in split_by_iteration(table[r, :known[r] + 1].tolist(), int(known[r]), s, e)]
        got = list(zip(*(x.tolist() for x in split_rounds(table, known, s, e))))
        assert got == want, trial


if __name__ == "__main__":
    print("PINNED = {")
    for name in CONFIGS:
        print(f"    {name!r}: {pinned(name)!r},")
    print("}")
