"""Several communication streams sharing links (comm.streams > 1): simfog.algorithms.allreduce.closed_form_streams'
loop over the collectives equals the event engine bit for bit wherever it runs, and hands over to the engine where
SimPy's order of same-instant events decides."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate, why_events
from tests.conftest import make_experiment, make_trace
from tests.test_analytic import HETERO, OVERHEADS, TRACES, _shipped, assert_same

MERGES = ["wfbp", "ddp", "threshold", "mgwfbp", "single", "bagua", "optimal"]
COLLECTIVES = ["ring", "tree", "hierarchical", "nccl", "rhd", "gloo_ring", "ps", "linear", "ompi"]
LAYOUTS = [(1, 2), (2, 2), (3, 2), (2, 8), (4, 1)]


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_merge_and_collective(merge, collective):
    """streams 2 and 3, compute mean and samples, five layouts, one to three iterations, seeds."""
    for streams, compute, (nodes, gpus) in itertools.product((2, 3), ("mean", "samples"), LAYOUTS):
        if collective == "rhd" and nodes * gpus & (nodes * gpus - 1):
            continue  # rhd needs a power of two
        exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=nodes, gpus_per_node=gpus,
                              merge=merge, collective=collective, compute=compute, streams=streams,
                              iterations=1 + (nodes + streams) % 3, seed=nodes * 7 + streams, threshold_bytes=3e6)
        assert_same(exp)


@pytest.mark.parametrize("hetero,overheads,compute,iterations",
                         list(itertools.product(HETERO, OVERHEADS, ["mean", "samples"], [1, 3])))
def test_heterogeneity_overheads_and_compute_modes(hetero, overheads, compute, iterations):
    """Slow ranks and nodes, stragglers, bucket copies (pack and unpack on the stream), launch overheads and the
    overlap slowdown."""
    for merge, collective, streams in (("wfbp", "ring", 2), ("ddp", "nccl", 3), ("mgwfbp", "hierarchical", 2),
                                       ("threshold", "tree", 3)):
        exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=2, gpus_per_node=4,
                              merge=merge, collective=collective, compute=compute, iterations=iterations, seed=4,
                              streams=streams, threshold_bytes=2e6, **OVERHEADS[overheads])
        assert_same(replace(exp, heterogeneity=HETERO[hetero]))


@pytest.mark.parametrize("copy,overhead", [(3e9, 0.0), (0.0, 30e-6), (3e8, 5e-6)])
def test_copies_and_overheads_apart(copy, overhead):
    """Packs and unpacks alone, launch overheads alone, both: the extra comm records interleave differently per
    rank (unpacks end for every rank at once, packs when each rank's stream gets there)."""
    for merge, streams, compute in itertools.product(("wfbp", "ddp"), (2, 3), ("mean", "samples")):
        exp = make_experiment(TRACES["sampled"], nodes=3, gpus_per_node=2, merge=merge, collective="ring",
                              compute=compute, streams=streams, seed=9, bucket_copy_Bps=copy,
                              collective_overhead_s=overhead)
        exp = replace(exp, heterogeneity=Heterogeneity(straggler_rate=0.4, straggler_delay_s=3e-3,
                                                       straggler_distribution="exponential"))
        assert_same(exp)


def test_symmetric_runs_match_too():
    exp = make_experiment(TRACES["fixed"], nodes=4, gpus_per_node=2, merge="wfbp", collective="ring", streams=2)
    a, _ = assert_same(exp, symmetric=None)
    assert a.symmetric and simulate(exp).path == "analytic"


@pytest.mark.parametrize("trace,merge,collective,compute,streams", [
    ("resnet50-cpu-b32.json.gz", "ddp", "ring", "samples", 2),
    ("resnet50-cpu-b32.json.gz", "wfbp", "hierarchical", "mean", 3),
    ("gpt2-cpu-b8.json.gz", "ddp", "ring", "mean", 2),
    ("gpt2-cpu-b8.json.gz", "mgwfbp", "nccl", "samples", 2),
    ("default", "ddp", "tree", "mean", 3),
])
def test_shipped_traces(trace, merge, collective, compute, streams):
    exp = _shipped(trace).with_ranks(16).with_comm(merge=merge, collective=collective, threshold_bytes=25e6,
                                                    streams=streams)
    exp = replace(exp, iterations=2, workload=replace(exp.workload, compute=compute))
    assert_same(exp)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge=st.sampled_from(MERGES), collective=st.sampled_from(COLLECTIVES), nodes=st.integers(1, 4),
       gpus=st.integers(1, 4), iterations=st.integers(1, 3), seed=st.integers(0, 2**32), streams=st.integers(2, 4),
       compute=st.sampled_from(["mean", "samples"]), slow=st.floats(1.0, 3.0), rate=st.floats(0.0, 0.5),
       copies=st.booleans())
def test_property_analytic_equals_events(merge, collective, nodes, gpus, iterations, seed, streams, compute, slow,
                                         rate, copies):
    ranks = nodes * gpus
    if ranks == 1 or collective == "rhd" and ranks & (ranks - 1):
        nodes, gpus = 2, 2  # one rank: no analytic path (below); rhd needs a power of two
    exp = make_experiment(TRACES["fixed" if compute == "mean" else "sampled"], nodes=nodes, gpus_per_node=gpus,
                          merge=merge, collective=collective, compute=compute, iterations=iterations, seed=seed,
                          streams=streams, threshold_bytes=2e6, **(OVERHEADS["copies"] if copies else {}))
    exp = replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((0, slow),), straggler_rate=rate,
                                                   straggler_delay_s=2e-3, straggler_distribution="uniform"))
    assert_same(exp)


def test_one_rank_takes_the_event_engine():
    """One rank: its collectives take no time and end at the instant they start, where SimPy's tie order decides."""
    exp = make_experiment(TRACES["fixed"], nodes=1, gpus_per_node=1, merge="wfbp", streams=2)
    sim = new_simulation(exp)
    assert "takes no time" in why_events(sim)
    assert sim.run().summary()["path"] == "events"
    with pytest.raises(ValueError, match="analytic path was requested"):
        new_simulation(exp, path="analytic").run()


def _tied(**extra):
    """Two ranks, two buckets of 4000 bytes ready at 0.5 s and 0.5 s + `second`, each allreduce 0.25 s however many
    share the links (latency only): exact binary fractions, so times meet exactly."""
    second = extra.pop("second")
    trace = make_trace([0.0, 0.0], [second, 0.5], [1000, 1000])
    return make_experiment(trace, nodes=1, gpus_per_node=2, collective="linear", alpha=0.25, beta=0.0, streams=2,
                           iterations=2, **extra)


@pytest.mark.parametrize("exp,why", [
    # bucket 1's last member arrives at 0.75 s, when bucket 0 is due to end
    (_tied(second=0.25), "the shared links' next completion is due"),
    # bucket 0 packs [0.5, 0.625], runs to 0.875 and unpacks to 1.0; bucket 1, launched at 0.875, packs to 1.0
    (_tied(second=0.375, bucket_copy_Bps=4000 / 0.125), "an unpack of one rank end at one instant"),
])
def test_ties_hand_over_to_the_event_engine(exp, why):
    sim = new_simulation(exp, symmetric=False)
    assert why_events(sim) is None
    result = sim.run()
    assert result.path == "events"
    with pytest.raises(ValueError, match=why):
        new_simulation(exp, symmetric=False, path="analytic").run()
    # a hair off the tie, the analytic path runs it, and equals the engine
    trace = exp.workload.trace
    layers = (replace(trace.layers[0], backward_s=(trace.layers[0].backward_s[0] + 2**-20,)), trace.layers[1])
    assert_same(replace(exp, workload=replace(exp.workload, trace=replace(trace, layers=layers))))


def test_blocks_of_ranks_sum_alike(monkeypatch):
    """Large runs sum their comm records in blocks of ranks (bounded tables): blocks of a few ranks give the
    same bits."""
    from simfog.algorithms.allreduce import closed_form_streams as analytic_streams

    monkeypatch.setattr(analytic_streams, "CHUNK", 40)
    exp = make_experiment(TRACES["sampled"], nodes=3, gpus_per_node=4, merge="wfbp", collective="ring",
                          compute="samples", streams=3, seed=5, bucket_copy_Bps=3e9, collective_overhead_s=30e-6)
    assert_same(replace(exp, heterogeneity=HETERO["stragglers"]))


def test_per_call_variation_on_shared_links_takes_the_event_engine():
    """Collectives that share links and vary per call: the event engine draws them (the channel scales each
    collective's time by its factor); its runs are seeded."""
    from tests.test_analytic import with_spread

    exp = with_spread(make_experiment(TRACES["sampled"], nodes=2, gpus_per_node=2, merge="wfbp", compute="samples",
                                      streams=2))
    sim = new_simulation(exp)
    assert "vary per call" in why_events(sim)
    a, b = sim.run(), simulate(exp)
    assert a.path == "events" and a.summary() == b.summary()
    assert a.summary()["iteration_time_s"] != simulate(with_spread(exp, 0.0, 0.0)).summary()["iteration_time_s"]
