"""validate.host_calibration: the in-step span of a collective (hand-checked), the non-negative line through the
per-size medians of its excess over the calibrated cost, the probes each family runs and how each family's
prediction pays the fit (by hand, through simfog's own inputs)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from simfog.cluster import Link
from simfog.simulation import new_simulation, simulate
from validate.calibration import simulated_experiment
from validate.comparison.compare import steady_iteration_s
from validate.families import FAMILIES
from validate.families.decentralized import by_phase, predicted_spans, with_latency
from validate.host_calibration import (
    COVER,
    FSDP_PROBE_ITERATIONS,
    FSDP_PROBE_LAYERS,
    PROBE_BACKWARD_S,
    PROBE_SIZES,
    HostFit,
    excess_points,
    fit,
    fit_line,
    probe_trace,
    spans,
    step_excess,
)

from ..conftest import make_experiment, make_trace


def _it(launch, done, **extra):
    return {"launch": launch, "done": done, "launch_order": list(range(len(launch))), **extra}


def test_a_span_starts_at_the_last_launch_or_at_the_previous_completion():
    # collective 0: the last launch is rank 1's at 5 ms; ranks end at 20 and 22 ms: spans 15 and 17, mean 16 ms.
    # collective 1: launched by 12 ms, but each rank's previous one ended later (20, 22 ms): spans 10 and 9 ms.
    per_rank = [{"iterations": [_it([0.000, 0.010], [0.020, 0.030])]},
                {"iterations": [_it([0.005, 0.012], [0.022, 0.031])]}]
    assert spans(per_rank) == [[pytest.approx(0.016), pytest.approx(0.0095)]]
    # recorded peers gate a rank's collective: rank 0 waits for itself only, rank 1 for both (last launch 5 ms)
    per_rank = [{"iterations": [_it([0.000], [0.020], peers=[[0]])]},
                {"iterations": [_it([0.005], [0.022], peers=[[0, 1]])]}]
    assert spans(per_rank) == [[pytest.approx((0.020 + 0.017) / 2)]]
    # the excess over what the calibrated model gives each collective, with its bytes
    assert excess_points(per_rank, [[(1000.0, 0.015)]]) == [(1000.0, pytest.approx(0.0035))]


def test_the_fit_is_the_non_negative_line_through_the_medians_by_size():
    a, b = 1e-3, 2e-9
    exact = [(m, a + b * m) for m in PROBE_SIZES]
    assert fit_line(exact) == (pytest.approx(a), pytest.approx(b))
    # a stalled collective moves its size's median not at all
    assert fit_line([*exact, (1_000, a + b * 1_000), (1_000, 0.5)]) == (pytest.approx(a), pytest.approx(b))
    # below zero at small sizes (the calibrated model slower there): the best line through the origin
    xs = PROBE_SIZES
    down = [(m, -1e-3 + 1e-8 * m) for m in xs]
    through_origin = sum(x * (-1e-3 + 1e-8 * x) for x in xs) / sum(x * x for x in xs)
    assert fit_line(down) == (0.0, pytest.approx(through_origin))
    # falling with size: the best constant
    assert fit_line([(m, 2e-3 - 1e-9 * m) for m in xs]) == (pytest.approx(2e-3 - 1e-9 * sum(xs) / 4), 0.0)
    # faster than calibrated everywhere: no host cost
    assert fit_line([(m, -1e-3) for m in xs]) == (0.0, 0.0)
    f = fit(exact, "allreduce-hooks")
    assert (f.overhead_s, f.per_byte_s, f.points) == (pytest.approx(a), pytest.approx(b), 4)
    assert f.how.startswith("host probe: allreduce-hooks") and "1.000 ms + 2.000 ns/B" in f.how


def test_the_allreduce_probe_covers_each_collective_with_compute():
    """Each layer's backward lasts COVER times the allreduce of the layer after it (+1 ms): collectives overlap
    compute, never each other; DDP's probe puts every tensor in its own bucket (a cap of one byte)."""
    trace = probe_trace(cover=lambda m: 1e-8 * m)
    assert [t.nbytes for t in trace.tensors.values()] == list(PROBE_SIZES)
    backward = [layer.backward_s[0] for layer in trace.layers]
    # 1 kB's layer covers 30 kB (0.3 ms: the 3 ms floor), 30 kB's 300 kB (4.75 ms), 300 kB's 1 MB (13.5 ms)
    assert backward == [PROBE_BACKWARD_S, pytest.approx(COVER * 3e-3 + 1e-3), pytest.approx(COVER * 1e-2 + 1e-3),
                        PROBE_BACKWARD_S]
    like = make_experiment(make_trace([1e-3], [1e-3], [10]), merge="ddp")
    probes = FAMILIES["allreduce"].host_probes([like, like.with_comm(merge="mgwfbp")], lambda op, m: 1e-8 * m)
    assert set(probes) == {"allreduce-ddp", "allreduce-hooks"}
    ddp, hooks = probes["allreduce-ddp"][1], probes["allreduce-hooks"][1]
    assert (ddp.comm.merge, ddp.comm.threshold_bytes, hooks.comm.merge) == ("ddp", 1.0, "wfbp")
    assert ddp.comm.collective_overhead_s is None and ddp.workload.trace.tensors.keys() == trace.tensors.keys()


@pytest.fixture
def record():
    """A host record as validate.calibration.host_overheads writes it: copies at 1 GB/s, no per-collective cost."""
    return {"bucket_copy_Bps": 1e9, "collective_overhead_s": 0.0, "overlap_slowdown": 1.0, "device": "a CPU",
            "by": "the validator", "how": "measured copies"}


def test_allreduce_pays_the_fit_per_bucket_as_overhead_and_slower_copies(record):
    """Two buckets of 4000 B: each pays 1 ms and 4000 x 4 ns more on its stream (the copy becomes
    1 / (1 ns + 2 ns) B/s: 2M/bw grows by 4 ns x M)."""
    exp = make_experiment(make_trace([0.1, 0.1], [0.1, 0.1], [1000, 1000]), nodes=2, gpus_per_node=1)
    base = simulated_experiment(exp, None, record)
    host = {"allreduce-hooks": HostFit(1e-3, 4e-9, 8, "host probe: test")}
    paid, got, note = FAMILIES["allreduce"].with_host_costs(base, host)
    oh = paid.overheads()
    assert got is host["allreduce-hooks"] and note.startswith("host probe: test; applied as collective_overhead")
    assert oh.collective_overhead_s == 1e-3 and oh.bucket_copy_Bps == pytest.approx(1 / 3e-9)
    assert oh.sources["collective_overhead_s"].endswith("(host probe: test)")
    t_base, t_paid = simulate(base).summary(), simulate(paid).summary()
    assert t_paid["comm_s"] == pytest.approx(t_base["comm_s"] + 2 * (1e-3 + 4e-9 * 4000), rel=1e-9)
    # a DDP row takes DDP's fit; a failed probe leaves the prediction as it was and says why
    ddp = replace(base, comm=replace(base.comm, merge="ddp"))
    assert FAMILIES["allreduce"].with_host_costs(ddp, host) == (ddp, None, "")
    why = "host probe failed (launch failed: rank 1 exited)"
    assert FAMILIES["allreduce"].with_host_costs(base, {"allreduce-hooks": why}) == (base, None, why)


def test_sharded_and_wagma_pay_the_fit_at_their_collectives_size(record):
    trace = make_trace([1e-3] * 4, [2e-3] * 4, [1000, 0, 3000, 2000])
    fsdp = simulated_experiment(make_experiment(trace, nodes=2, gpus_per_node=1, algorithm="fsdp"), None, record)
    fit_ = HostFit(1e-3, 2e-9, 8, "host probe: test")
    colls = new_simulation(fsdp).algorithm.plan.colls
    mean = sum(c.nbytes for c in colls) / len(colls)
    paid, _, note = FAMILIES["fsdp"].with_host_costs(fsdp, {"fsdp-reshard-k1": fit_})
    # per collective the fit at the plan's mean size: every iteration pays the fit's sum over its collectives
    assert paid.overheads().collective_overhead_s == pytest.approx(1e-3 + 2e-9 * mean)
    assert len(colls) * paid.overheads().collective_overhead_s == pytest.approx(
        sum(fit_.excess_s(c.nbytes) for c in colls))
    assert "mean collective" in note
    wagma = simulated_experiment(make_experiment(trace, nodes=4, gpus_per_node=1, algorithm="wagma", group_size=2),
                                 None, record)
    paid, _, _ = FAMILIES["wagma"].with_host_costs(wagma, {"wagma": fit_})
    assert paid.overheads().collective_overhead_s == pytest.approx(1e-3 + 2e-9 * trace.nbytes)


def test_fsdp_probes_each_variant_the_rows_run_at_every_size(record):
    trace = make_trace([1e-3] * 4, [2e-3] * 4, [1000, 0, 3000, 2000])
    rows = [make_experiment(trace, nodes=2, gpus_per_node=1, algorithm="fsdp", fsdp_unit=unit,
                            reshard_after_forward=reshard, prefetch=1)
            for unit in ("layer", 300e3) for reshard in (True, False)]
    probes = FAMILIES["fsdp"].host_probes(rows, None)
    # the rows' plans' mean collectives: units of a layer (3 with parameters: 4000, 12000, 8000 B; with reshard
    # two all-gathers and a reduce-scatter each, without one all-gather and a reduce-scatter), or of 300 kB (one)
    means = {}
    for exp in rows:
        colls = new_simulation(exp).algorithm.plan.colls
        means.setdefault(FAMILIES["fsdp"]._probe(exp)[0], set()).add(sum(c.nbytes for c in colls) / len(colls))
    assert means == {"fsdp-reshard-k1": {8000.0, 24000.0}, "fsdp-keep-k1": {8000.0, 24000.0}}
    assert sorted(probes) == sorted(f"fsdp-{v}-k1-{s}B" for v in ("reshard", "keep") for s in (8000, 24000))
    for pid, (key, exp) in probes.items():
        assert pid.startswith(key) and exp.comm.fsdp_unit == "layer" and exp.iterations == FSDP_PROBE_ITERATIONS
        assert exp.comm.reshard_after_forward == (key == "fsdp-reshard-k1")
        sizes = {t.nbytes for t in exp.workload.trace.tensors.values()}
        assert len(exp.workload.trace.layers) == FSDP_PROBE_LAYERS and sizes == {int(pid.split("-")[-1][:-1])}


def test_fsdp_probe_solves_the_model_for_the_overhead_the_step_pays(record):
    """A probe whose measured steps last what simfog predicts with 0.7 ms per collective: its point is 0.7 ms at the
    probe's size (within the bisection's tolerance); steps no longer than the model's give 0."""
    trace = probe_trace((300_000,) * FSDP_PROBE_LAYERS)
    exp = simulated_experiment(make_experiment(trace, nodes=4, gpus_per_node=1, algorithm="fsdp", iterations=6,
                                               nic=Link(3e-4, 25e6)), None, record)
    slower = simulate(replace(exp, comm=replace(exp.comm, collective_overhead_s=7e-4)))
    target = steady_iteration_s(slower)
    assert step_excess(exp, target) == pytest.approx(7e-4, abs=2e-6)
    assert step_excess(exp, 0.5 * steady_iteration_s(simulate(exp))) == 0.0

    def records(step_s):  # every rank ends iteration k at (k + 1)·step_s: steady iterations of step_s
        its = [{"start": k * step_s, "forward_end": k * step_s, "backward_end": k * step_s,
                "optimizer_start": (k + 1) * step_s, "end": (k + 1) * step_s, "launch": [], "done": [],
                "launch_order": []} for k in range(6)]
        return [{"iterations": its, "buckets": []} for _ in range(4)]

    sim = new_simulation(exp)
    prepared = SimpleNamespace(experiment=exp, sim=sim, plan=FAMILIES["fsdp"].plan(sim))
    ((size, x),) = FAMILIES["fsdp"].host_points(prepared, records(target))
    assert size == 300_000 and x == pytest.approx(7e-4, abs=2e-6)


def _neighbor(latency_s=1e-4):
    trace = make_trace([1e-3] * 4, [2e-3] * 4, [25_000] * 4)
    exp = make_experiment(trace, nodes=4, gpus_per_node=1, algorithm="neighbor", topology="one_peer_exp2",
                          nic=Link(latency_s, 25e6), iterations=6)
    return simulated_experiment(exp, None, None)


def test_neighbour_averaging_pays_the_fit_in_its_links_latency():
    sim_exp = _neighbor()
    slower, per_link = with_latency(sim_exp, 2e-3)
    assert per_link == 2e-3  # one message of the model per peer: one latency
    assert slower.cluster.nic.latency_s == pytest.approx(sim_exp.cluster.nic.latency_s + 2e-3)
    assert slower.cluster.intra.latency_s == pytest.approx(sim_exp.cluster.intra.latency_s + 2e-3)
    paid, _, note = FAMILIES["neighbor"].with_host_costs(sim_exp, {"neighbor": HostFit(1e-3, 1e-8, 2, "t")})
    assert paid.cluster.nic.latency_s == pytest.approx(sim_exp.cluster.nic.latency_s + 1e-3 + 1e-8 * 400_000)
    assert "more latency on every link" in note


def test_neighbour_probe_solves_the_model_for_the_latency_the_step_adds():
    """Records whose exchanges last, phase for phase of one-peer exp2 (medians, averaged over the phases), what the
    model gives with 3 ms more latency on every link: the probe's point is those 3 ms (within the bisection's
    tolerance), whatever the links' sharing makes of latency."""
    sim_exp = _neighbor()
    config = {**FAMILIES["neighbor"].worker_fields(new_simulation(sim_exp), 0), "warmup": 0}
    phases = config["schedule"]
    assert phases == [0, 1, 0, 1, 0, 1]
    target = by_phase(predicted_spans(simulate(with_latency(sim_exp, 3e-3)[0])), phases)
    assert target > by_phase(predicted_spans(simulate(sim_exp)), phases)
    n = sim_exp.cluster.ranks
    per_rank = [{"iterations": [_it([0.0], [target], peers=[list(range(n))]) for _ in range(6)]}
                for _ in range(n)]
    prepared = SimpleNamespace(experiment=sim_exp, config=config)
    (nbytes, extra), = FAMILIES["neighbor"].host_points(prepared, per_rank)
    assert nbytes == 400_000
    model = by_phase(predicted_spans(simulate(with_latency(sim_exp, extra)[0])), phases)
    assert model == pytest.approx(target, abs=2e-5)
    # an exchange no slower than the model's: nothing to add
    fast = [{"iterations": [_it([0.0], [1e-4], peers=[list(range(n))])] * 6} for _ in range(n)]
    assert FAMILIES["neighbor"].host_points(prepared, fast) == [(400_000, 0.0)]


def test_by_phase_is_the_mean_of_the_phases_medians():
    # phase 0: 1, 2, 30 (a stall) -> 2; phase 1: 10, 12 -> 11; mean 6.5
    assert by_phase({0: 1.0, 1: 10.0, 2: 2.0, 3: 12.0, 4: 30.0}, [0, 1, 0, 1, 0]) == 6.5


def test_rows_say_what_the_probe_changed_on_the_same_measurements():
    from validate.comparison import compare
    from validate.comparison.rows import unprobed_keys

    exp = make_experiment(make_trace([0.1, 0.1], [0.1, 0.1], [1000, 1000]), nodes=2, gpus_per_node=1)
    # two iterations ending at 0.5 and 0.9 s: steady state 0.4 s
    records = [{"buckets": [["l1.weight"], ["l0.weight"]],
                "iterations": [{"start": s, "forward_end": s + 0.1, "backward_end": s + 0.2, "launch": [s + 0.15] * 2,
                                "done": [s + 0.3] * 2, "optimizer_start": s + 0.3, "end": e,
                                "launch_order": [0, 1]} for s, e in ((0.0, 0.5), (0.5, 0.9))]} for _ in range(2)]
    measured = compare.measured_result(exp, records, bucket_bytes=[4000, 4000])
    unprobed = simulate(exp)
    t_u = compare.steady_iteration_s(unprobed)
    assert unprobed_keys(measured, unprobed) == {"predicted_without_probe_s": t_u,
                                                 "rel_error_without_probe": pytest.approx((t_u - 0.4) / 0.4)}
    assert unprobed_keys(measured, None) == {}


def test_the_bench_verdict_gives_the_error_without_the_probe_on_the_same_rows():
    from validate.bench import verdict

    rows = [{"id": "a", "rel_error": 0.01, "rel_error_without_probe": -0.05, "host_limited": False},
            {"id": "b", "rel_error": -0.03, "rel_error_without_probe": -0.09, "host_limited": False},
            {"id": "c", "rel_error": -0.40, "rel_error_without_probe": -0.50, "host_limited": True}]
    text = verdict(rows)
    assert "mean signed error -1.0% over the rows the rig can emulate" in text
    assert ("without the host probe, on the same measurements: median 7.0%, worst 9.0%, mean signed -7.0% over 2 "
            "of those rows") in text
