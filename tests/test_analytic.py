"""The analytic (max-plus) path equals the event engine bit for bit wherever both can run, and is chosen
automatically only there."""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import cache

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate, why_events
from tests.conftest import REPO, make_experiment, make_trace

MERGES = ["wfbp", "single", "threshold", "ddp", "bagua", "mgwfbp", "optimal"]
COLLECTIVES = ["ring", "gloo_ring", "rhd", "tree", "hierarchical", "ps", "nccl", "linear", "ompi"]
SORT = ["rank", "iteration", "start_s", "kind", "name"]


def _trace(samples: int):
    rng = np.random.default_rng(11)
    n = 9
    fwd, bwd = rng.uniform(1e-3, 4e-3, n), rng.uniform(1e-3, 8e-3, n)
    elems = rng.integers(1, 2_000_000, n)
    if samples == 1:
        return make_trace(fwd, bwd, elems, optimizer=7e-4)
    rows = [(list(fwd * rng.uniform(0.7, 1.6, n)), list(bwd * rng.uniform(0.7, 1.6, n))) for _ in range(samples)]
    return make_trace(fwd, bwd, elems, samples=rows, optimizer=7e-4)


TRACES = {"fixed": _trace(1), "sampled": _trace(5)}


def assert_same(exp, *, symmetric=False, frames=True):
    """The analytic run of `exp` equals the event engine's: summary, per-iteration frame and every interval.
    Returns both results (analytic, events)."""
    a = simulate(exp, symmetric=symmetric)
    b = simulate(exp, symmetric=symmetric, path="events")
    assert a.path == "analytic" and b.path == "events"
    sa, sb = a.summary(), b.summary()
    assert sa.pop("path") == "analytic" and sb.pop("path") == "events"
    assert sa == sb  # bit for bit: floats compared with ==
    if frames:
        pd.testing.assert_frame_equal(a.iterations(), b.iterations(), check_exact=True)
        ia = a.intervals().sort_values(SORT, kind="stable").reset_index(drop=True)
        ib = b.intervals().sort_values(SORT, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(ia, ib, check_exact=True)
    return a, b


HETERO = {
    "none": Heterogeneity(),
    "slow": Heterogeneity(rank_slowdown=((1, 1.7),), node_slowdown=((0, 1.2),)),
    "stragglers": Heterogeneity(straggler_rate=0.3, straggler_delay_s=4e-3),
}
OVERHEADS = {
    "none": {},
    "copies": dict(bucket_copy_Bps=3e9, collective_overhead_s=30e-6, overlap_slowdown=1.3),
}


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_merge_and_collective(merge, collective):
    for compute, ranks_iter in (("fixed", (1, 3)), ("sampled", (2, 2))):
        for nodes, gpus in ((1, 1), (2, 2) if collective == "rhd" else (3, 2), (2, 8)):  # rhd: powers of two
            extra = {"threshold_bytes": 3e6} if merge == "threshold" else {}
            exp = make_experiment(TRACES[compute], nodes=nodes, gpus_per_node=gpus, merge=merge,
                                  collective=collective, compute="mean" if compute == "fixed" else "samples",
                                  iterations=ranks_iter[nodes % 2], seed=nodes, **extra)
            assert_same(exp, frames=nodes * gpus <= 6)


@pytest.mark.parametrize("hetero,overheads,compute,iterations",
                         list(itertools.product(HETERO, OVERHEADS, ["mean", "samples"], [1, 3])))
def test_heterogeneity_overheads_and_compute_modes(hetero, overheads, compute, iterations):
    for merge, collective in (("wfbp", "ring"), ("ddp", "nccl"), ("mgwfbp", "hierarchical")):
        exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=2, gpus_per_node=4,
                              merge=merge, collective=collective, compute=compute, iterations=iterations, seed=4,
                              **OVERHEADS[overheads])
        exp = replace(exp, heterogeneity=HETERO[hetero])
        assert_same(exp)


@pytest.mark.parametrize("algorithm", ["fp16", "bytegrad", "qadam", "powersgd"])
def test_compressed_allreduces(algorithm):
    exp = make_experiment(TRACES["sampled"], nodes=2, gpus_per_node=2, merge="ddp", collective="ring",
                          compute="samples", algorithm=algorithm)
    assert_same(exp)


def test_symmetric_runs_match_too():
    exp = make_experiment(TRACES["fixed"], nodes=4, gpus_per_node=2, merge="ddp", collective="ring")
    assert_same(exp, symmetric=None)
    assert simulate(exp).symmetric


@cache
def _shipped(name: str):
    from simfog import experiment
    from simfog.cli import DEFAULT_EXPERIMENT

    exp = experiment.load(DEFAULT_EXPERIMENT)
    if name != "default":
        from simfog.trace import load_model_trace

        exp = replace(exp, workload=replace(exp.workload, trace=load_model_trace(REPO / "traces" / name),
                                            trace_path=str(REPO / "traces" / name)))
    return exp


@pytest.mark.parametrize("trace,merge,collective,compute", [
    ("resnet50-cpu-b32.json.gz", "wfbp", "ring", "samples"),
    ("resnet50-cpu-b32.json.gz", "mgwfbp", "hierarchical", "mean"),
    ("gpt2-cpu-b8.json.gz", "ddp", "nccl", "samples"),
    ("gpt2-cpu-b8.json.gz", "threshold", "tree", "mean"),
    ("default", "ddp", "ring", "mean"),
    ("default", "optimal", "nccl", "samples"),
])
def test_shipped_traces(trace, merge, collective, compute):
    exp = _shipped(trace).with_ranks(16).with_comm(merge=merge, collective=collective, threshold_bytes=25e6)
    exp = replace(exp, iterations=2, workload=replace(exp.workload, compute=compute))
    assert_same(exp, frames=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge=st.sampled_from(MERGES), collective=st.sampled_from(COLLECTIVES), nodes=st.integers(1, 4),
       gpus=st.integers(1, 4), iterations=st.integers(1, 3), seed=st.integers(0, 2**32),
       compute=st.sampled_from(["mean", "samples"]), slow=st.floats(1.0, 3.0), rate=st.floats(0.0, 0.5),
       copies=st.booleans())
def test_property_analytic_equals_events(merge, collective, nodes, gpus, iterations, seed, compute, slow, rate,
                                         copies):
    assume(collective != "rhd" or not (nodes * gpus) & (nodes * gpus - 1))  # rhd needs a power of two
    exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=nodes, gpus_per_node=gpus,
                          merge=merge, collective=collective, compute=compute, iterations=iterations, seed=seed,
                          threshold_bytes=2e6, **(OVERHEADS["copies"] if copies else {}))
    exp = replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((0, slow),), straggler_rate=rate,
                                                   straggler_delay_s=2e-3, straggler_distribution="uniform"))
    assert_same(exp)


@pytest.mark.parametrize("why,changes", [
    ("fuses at run time", dict(merge="horovod")),
    ("decides while running", dict(algorithm="wagma")),
])
def test_dynamic_schedules_take_the_event_engine(why, changes):
    exp = make_experiment(TRACES["fixed"], nodes=2, gpus_per_node=2, **{"merge": "ddp", **changes})
    sim = new_simulation(exp)
    assert why in why_events(sim)
    result = sim.run()
    assert result.path == "events" and result.summary()["path"] == "events"
    with pytest.raises(ValueError, match="analytic path was requested"):
        new_simulation(exp, path="analytic").run()


def test_summary_names_the_path_and_results_are_columns():
    exp = make_experiment(TRACES["sampled"], nodes=2, gpus_per_node=2, merge="wfbp", compute="samples")
    result = simulate(exp)
    assert result.summary()["path"] == "analytic" and result.records is None
    assert isinstance(result.columns["end_s"], np.ndarray) and result.columns["end_s"].shape == (4, 3)
    assert len(result.intervals()) > 0  # records built on demand


def with_spread(exp, nic: float = 0.06, intra: float = 0.03, variation: str = "draw"):
    """`exp` whose links vary per call (simfog.variation), drawn or at their expected slowest."""
    c = exp.cluster
    return replace(exp.with_comm(variation=variation),
                   cluster=replace(c, nic=replace(c.nic, spread=nic), intra=replace(c.intra, spread=intra)))


@pytest.mark.parametrize("variation", ["draw", "expected"])
@pytest.mark.parametrize("merge,collective", [("wfbp", "ring"), ("ddp", "hierarchical"), ("mgwfbp", "linear"),
                                              ("single", "nccl")])
def test_per_call_variation_analytic_equals_events(merge, collective, variation):
    """Collectives drawn per call (or at their expected slowest): the closed form reads the event engine's table of
    the iteration's durations, so both agree bit for bit, heterogeneity and overheads included; the symmetric path
    too (every bucket's collective is among all ranks)."""
    for compute, hetero, overheads in (("mean", "none", "none"), ("samples", "stragglers", "copies")):
        exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=3, gpus_per_node=2,
                              merge=merge, collective=collective, compute=compute, iterations=4, seed=5,
                              **OVERHEADS[overheads])
        exp = with_spread(replace(exp, heterogeneity=HETERO[hetero]), variation=variation)
        a, _ = assert_same(exp)
        assert a.summary() != simulate(with_spread(exp, 0.0, 0.0)).summary()
    assert_same(with_spread(make_experiment(TRACES["fixed"], nodes=3, gpus_per_node=2, merge=merge,
                                            collective=collective)), symmetric=True)
