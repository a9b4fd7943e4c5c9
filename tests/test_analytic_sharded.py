"""The analytic path of the sharded algorithms (simfog.algorithms.sharded.closed_form) equals the event engine bit for
bit: over a grid of fsdp units, prefetch, resharding, hsdp groups, ZeRO stages with and without overlap, bucket sizes,
mixed dtypes, compute modes, collectives, rank counts and heterogeneity, the summary, the per-iteration frame and every
interval are equal (floats compared with ==), and the path is chosen automatically and named in the summary."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simfog.algorithms.sharded.program import FSDP
from simfog.algorithms.sharded.program import ShardedAlgorithm as _Sharded
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate, why_events
from tests.conftest import make_experiment, make_trace
from tests.test_analytic import assert_same as assert_same_results


def _trace(samples: int, *, host: bool = False):
    """Nine layers, one without parameters, random times and sizes; `samples` recorded iterations."""
    rng = np.random.default_rng(7 + samples)
    n = 9
    fwd, bwd = rng.uniform(1e-3, 4e-3, n), rng.uniform(1e-3, 8e-3, n)
    elems = rng.integers(1, 2_000_000, n)
    elems[3] = 0
    rows = None
    if samples > 1:
        rows = [(list(fwd * rng.uniform(0.7, 1.6, n)), list(bwd * rng.uniform(0.7, 1.6, n))) for _ in range(samples)]
    trace = make_trace(fwd, bwd, elems, samples=rows, optimizer=6e-3)
    if host:  # host time (data loading) is not sharded: the optimizer formula keeps it whole
        trace = replace(trace, optimizer_s=tuple(rng.uniform(4e-3, 8e-3, samples)),
                        host_s=tuple(rng.uniform(1e-3, 3e-3, samples)))
    return trace


TRACES = {"mean": _trace(1), "samples": _trace(5, host=True)}
def _comm_order(records) -> dict:
    """Per (rank, iteration) its wait and comm intervals in the order they were recorded: the order the summary's
    sums add them in. (Intervals, not names: collectives that start and end together are recorded in issue order
    here; SimPy may take them the other way when the earlier-issued one's last member joined later at that very
    instant, e.g. chained collectives of one rank that take no time, which changes no sum.)"""
    out: dict = {}
    for rank, iteration, kind, _name, start, end in records:
        if kind in ("comm", "wait"):
            out.setdefault((rank, iteration), []).append((kind, start, end))
    return out


def assert_same(exp, *, symmetric=False, frames=True):
    """The analytic run of `exp` equals the event engine's (tests.test_analytic.assert_same), and each rank's
    collectives come in the engine's record order."""
    a, b = assert_same_results(exp, symmetric=symmetric, frames=frames)
    if frames:
        assert _comm_order(a.records) == _comm_order(b.records)


MIXED = dict(param_dtype="bfloat16", reduce_dtype="float32")

FSDP_CONFIGS = [dict(algorithm="fsdp", fsdp_unit=unit, prefetch=k, reshard_after_forward=reshard)
                for unit in ("layer", "model", 6e6, (2, 3, 4)) for k in (0, 1, 2) for reshard in (True, False)]
HSDP_CONFIGS = [dict(algorithm="hsdp", hsdp_group=g, prefetch=k, reshard_after_forward=reshard)
                for g in (None, 2) for k in (0, 1) for reshard in (True, False)]
ZERO_CONFIGS = [dict(algorithm=a, overlap_comm=overlap, reduce_bucket_size=bucket)
                for a in ("zero1", "zero2", "zero3") for overlap in (None, True, False)
                for bucket in (1_500_000, 500_000_000)]
OTHER_CONFIGS = [
    dict(algorithm="fsdp", **MIXED),
    dict(algorithm="hsdp", fsdp_unit=6e6, prefetch=2, **MIXED),
    dict(algorithm="zero1", zero_reduce="reduce", allgather_bucket_size=3_000_000, reduce_bucket_size=2_000_000),
    dict(algorithm="zero2", zero_reduce="reduce", overlap_comm=True, reduce_bucket_size=2_000_000, **MIXED),
    dict(algorithm="zero2", allgather_bucket_size=2_500_000, param_dtype="float16"),
    dict(algorithm="zero3", prefetch_bucket_size=2_500_000, reduce_bucket_size=2_000_000, **MIXED),
    dict(algorithm="zero3", prefetch_bucket_size=10**9, overlap_comm=False),
    dict(algorithm="fsdp", collective_overhead_s=7e-4),  # per collective, beside its network cost
    dict(algorithm="hsdp", hsdp_group=2, collective_overhead_s=3e-4),
    dict(algorithm="zero2", overlap_comm=True, reduce_bucket_size=2_000_000, collective_overhead_s=5e-4),
]
CONFIGS = FSDP_CONFIGS + HSDP_CONFIGS + ZERO_CONFIGS + OTHER_CONFIGS

# (compute, nodes, gpus per node, collective, iterations, heterogeneity)
ENVIRONMENTS = [
    ("samples", 2, 2, "ring", 3, Heterogeneity()),
    ("mean", 3, 2, "hierarchical", 2, Heterogeneity(rank_slowdown=((1, 1.7),), node_slowdown=((2, 1.2),),
                                                    straggler_rate=0.3, straggler_delay_s=4e-3)),
    ("samples", 2, 4, "nccl", 2, Heterogeneity(straggler_rate=0.2, straggler_delay_s=2e-3,
                                                straggler_distribution="exponential")),
]


def _name(config: dict) -> str:
    return "-".join(f"{v}" for v in config.values())


@pytest.mark.parametrize("config", CONFIGS, ids=_name)
def test_analytic_equals_events_over_the_grid(config):
    for compute, nodes, gpus, collective, iterations, hetero in ENVIRONMENTS:
        exp = make_experiment(TRACES[compute], nodes=nodes, gpus_per_node=gpus, collective=collective,
                              compute=compute, iterations=iterations, seed=nodes, **config)
        assert_same(replace(exp, heterogeneity=hetero))


@pytest.mark.parametrize("config", [FSDP_CONFIGS[0], FSDP_CONFIGS[13], HSDP_CONFIGS[0], ZERO_CONFIGS[2],
                                    ZERO_CONFIGS[8], ZERO_CONFIGS[14]], ids=_name)
@pytest.mark.parametrize("collective", ["ring", "hierarchical", "nccl", "linear"])
def test_multi_node_rank_counts(config, collective):
    """One node, four nodes of eight, and a symmetric run (one rank stands for all; with and without it)."""
    for nodes, gpus, compute in ((1, 1, "samples"), (1, 4, "mean"), (4, 8, "samples")):
        exp = make_experiment(TRACES[compute], nodes=nodes, gpus_per_node=gpus, collective=collective,
                              compute=compute, iterations=2, seed=3, **config)
        assert_same(exp, frames=nodes * gpus <= 8)
    exp = make_experiment(TRACES["mean"], nodes=2, gpus_per_node=4, collective=collective, **config)
    assert_same(exp, symmetric=None)
    assert simulate(exp).symmetric


def test_degraded_nics_cost_each_group_by_its_nodes():
    exp = make_experiment(TRACES["samples"], nodes=4, gpus_per_node=2, collective="ring", compute="samples",
                          algorithm="hsdp", hsdp_group=2)
    exp = replace(exp, cluster=replace(exp.cluster, degraded_nics=((1, 1e9),)))
    assert_same(exp)


def test_hand_worked_schedules_with_ties():
    """The pencil examples of tests/test_sharded (round numbers: collectives tie, e.g. a reduce-scatter and an
    all-gather starting and ending together), every rank explicit."""
    from tests.test_sharded import THREE, TWO

    for trace in (TWO, THREE):
        for config in (dict(algorithm="fsdp"), dict(algorithm="fsdp", prefetch=0), dict(algorithm="hsdp"),
                       dict(algorithm="zero2", reduce_bucket_size=2 * 10**6), dict(algorithm="zero3"),
                       dict(algorithm="zero1", overlap_comm=True, reduce_bucket_size=2 * 10**6)):
            assert_same(make_experiment(trace, **config))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(algorithm=st.sampled_from(["fsdp", "hsdp", "zero1", "zero2", "zero3"]), nodes=st.integers(1, 3),
       gpus=st.sampled_from([1, 2, 4]), iterations=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       compute=st.sampled_from(["mean", "samples"]), slow=st.floats(1.0, 3.0), rate=st.floats(0.0, 0.5),
       prefetch=st.integers(0, 3), reshard=st.booleans(), overlap=st.sampled_from([None, True, False]),
       collective=st.sampled_from(["ring", "tree", "hierarchical", "nccl", "linear", "ps"]))
def test_property_analytic_equals_events(algorithm, nodes, gpus, iterations, seed, compute, slow, rate, prefetch,
                                         reshard, overlap, collective):
    comm = dict(prefetch=prefetch, reshard_after_forward=reshard) if algorithm in ("fsdp", "hsdp") else \
        dict(overlap_comm=overlap, reduce_bucket_size=1_500_000)
    exp = make_experiment(TRACES[compute], nodes=nodes, gpus_per_node=gpus, collective=collective,
                          compute=compute, iterations=iterations, seed=seed, algorithm=algorithm, **comm)
    exp = replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((0, slow),), straggler_rate=rate,
                                                   straggler_delay_s=2e-3, straggler_distribution="uniform"))
    assert_same(exp)


@pytest.mark.parametrize("algorithm", ["fsdp", "hsdp", "zero1", "zero2", "zero3"])
def test_chosen_automatically_and_named(algorithm):
    exp = make_experiment(TRACES["samples"], compute="samples", algorithm=algorithm)
    sim = new_simulation(exp)
    assert why_events(sim) is None
    result = sim.run()
    assert result.path == "analytic" and result.summary()["path"] == "analytic" and result.records is None
    assert simulate(exp, path="events").summary()["path"] == "events"


def test_an_algorithm_that_changes_the_program_takes_the_event_engine(monkeypatch):
    def run_iteration(self, rank, iteration, sample, slow, delay):
        yield from _Sharded.run_iteration(self, rank, iteration, sample, slow, delay)

    monkeypatch.setattr(FSDP, "run_iteration", run_iteration)
    exp = make_experiment(TRACES["mean"], algorithm="fsdp")
    assert "overrides run_iteration" in why_events(new_simulation(exp))
    assert simulate(exp).path == "events"
    with pytest.raises(ValueError, match="analytic path was requested"):
        simulate(exp, path="analytic")


def test_every_rank_at_scale_in_closed_form():
    """4,096 ranks of fsdp per layer: every rank explicit, no event engine (it would take minutes)."""
    exp = make_experiment(TRACES["samples"], nodes=512, gpus_per_node=8, collective="ring", compute="samples",
                          iterations=2, algorithm="fsdp")
    result = simulate(exp, symmetric=False)
    assert result.path == "analytic" and result.columns["end_s"].shape == (4096, 2)
    assert np.isfinite(result.summary()["iteration_time_s"])


def test_record_order_breaks_ties_by_issue_whatever_the_layout():
    """Columns are laid out by group kind, not in issue order; collectives that tie (same end and start) are still
    recorded in issue order."""
    from simfog.algorithms.sharded.closed_form_records import Records

    rec = object.__new__(Records)
    rec.cols, rec.issue = [0, 1, 2, 3], np.array([2, 0, 1, 3])
    rng = np.random.default_rng(0)
    E = rng.integers(0, 3, (200, 4)).astype(float)
    S = E - rng.integers(0, 2, (200, 4))
    want = np.lexsort((np.broadcast_to(rec.issue, E.shape), S, E), axis=1)
    assert (rec.order(S, E) == want).all()


@pytest.mark.parametrize("variation", ["draw", "expected"])
@pytest.mark.parametrize("config", FSDP_CONFIGS[::5] + HSDP_CONFIGS[::3] + ZERO_CONFIGS[::4] + OTHER_CONFIGS[-3:],
                         ids=_name)
def test_per_call_variation_analytic_equals_events(config, variation):
    """Collectives drawn per (iteration, collective, group) (or at their expected slowest): the closed form's
    durations are the engine's overhead + time · factor, so both agree bit for bit, records in order too."""
    from tests.test_analytic import with_spread

    for compute, nodes, gpus, collective, iterations, hetero in ENVIRONMENTS:
        exp = make_experiment(TRACES[compute], nodes=nodes, gpus_per_node=gpus, collective=collective,
                              compute=compute, iterations=iterations, seed=nodes, **config)
        assert_same(with_spread(replace(exp, heterogeneity=hetero), variation=variation))
