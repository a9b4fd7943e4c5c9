"""Decentralized averaging (BlueFog neighbour averaging, BAGUA decentralized): every cost against its α-β form on
hand-computed cases, who sends to whom, the receiver-ready rule, mixing quality in the summary, and 2048 ranks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simfog import experiment
from simfog.algorithms.codecs import minmax_uint8_bytes
from simfog.algorithms.dynamic.plan import split_by_iteration
from simfog.cluster import Link
from simfog.errors import ConfigError
from simfog.experiment import Heterogeneity
from simfog.simulation import new_simulation, simulate
from simfog.topology import topology

from .conftest import make_experiment, make_trace

A, BW = 1e-3, 1e9        # NIC: 1 ms latency, 1 GB/s (β = 1 ns/B)
NIC = Link(A, BW)
M = 4_000_000            # bytes: one float32 tensor of 1e6 elements
T_F, T_OPT = 0.010, 0.005


def run(t_b, *, nodes=4, gpus=1, elements=(M // 4,), forward=None, backward=None, **comm):
    """One experiment with fixed layer times; returns (Simulation, summary)."""
    n = len(elements)
    fwd = forward or [T_F / n] * n
    bwd = backward or [t_b / n] * n
    trace = make_trace(fwd, bwd, list(elements), optimizer=T_OPT)
    comm.setdefault("iterations", 4)
    exp = make_experiment(trace, nodes=nodes, gpus_per_node=gpus, nic=NIC, **comm)
    sim = new_simulation(exp)
    return sim, sim.run().summary()


# --- BlueFog neighbour averaging: AWC and ATC --------------------------------------------------------------------

@pytest.mark.parametrize("t_b", [0.002, 0.020])
def test_awc_one_peer_exp2_overlaps_backward(t_b):
    # 4 ranks, one per node: each sends its 4 MB model to one peer; no NIC is shared: α + M·β = 1 + 4 = 5 ms.
    # t_b = 2 ms: 10 + max(2, 5) + 5 = 20 ms; t_b = 20 ms: the exchange hides under backward, 10 + 20 + 5 = 35 ms.
    _, s = run(t_b, algorithm="neighbor", topology="one_peer_exp2")
    assert s["iteration_time_s"] == pytest.approx(T_F + max(t_b, A + M / BW) + T_OPT, rel=1e-12)
    assert s["iteration_time_s"] == pytest.approx({0.002: 0.020, 0.020: 0.035}[t_b], rel=1e-12)


def test_atc_single_layer_does_not_overlap():
    # One layer: its gradient is ready when backward ends, so the exchange follows it: 10 + 20 + 5 + 5 = 40 ms.
    _, s = run(0.020, algorithm="neighbor", topology="one_peer_exp2", combine="atc")
    assert s["iteration_time_s"] == pytest.approx(T_F + 0.020 + (A + M / BW) + T_OPT, rel=1e-12)
    assert s["comm_exposed_s"] == pytest.approx(A + M / BW, rel=1e-12)


def test_atc_launches_each_fused_buffer_when_its_gradients_are_ready():
    # Two 4 MB layers, 10 ms of backward each, fused buffers of 4 MB (comm.threshold): layer 1's buffer is ready at
    # 10 ms into backward and exchanged over [10, 15] ms under layer 0's backward; layer 0's at 20 ms, [20, 25].
    # Iteration: forward 10 + 25 + optimizer 5 = 40 ms (45 ms without the overlap).
    _, s = run(0.020, elements=(M // 4, M // 4), algorithm="neighbor", topology="one_peer_exp2", combine="atc",
               threshold_bytes=4e6)
    assert s["iteration_time_s"] == pytest.approx(0.040, rel=1e-12)
    assert s["buckets"] == 2


def test_exp2_static_divides_the_nic_by_the_degree():
    # 8 ranks on 8 nodes: exp2 sends to i+1, i+2, i+4 at once; the NIC is shared 3 ways: α + 3·M·β = 13 ms each.
    sim, s = run(0.002, nodes=8, algorithm="neighbor", topology="exp2")
    msgs = sim.algorithm.messages()
    assert np.allclose(msgs.end_s - msgs.start_s, A + 3 * M / BW, rtol=1e-12)
    assert s["iteration_time_s"] == pytest.approx(T_F + A + 3 * M / BW + T_OPT, rel=1e-12)
    assert s["comm_s"] == pytest.approx(A + 3 * M / BW, rel=1e-12)


@pytest.mark.parametrize(("cap", "shared"), [(None, 2 * M / BW), (0.8 * BW, 2 * M / BW), (0.25 * BW, M / (0.25 * BW))])
def test_one_peer_exp2_on_two_ranks_per_node_under_a_flow_cap(cap, shared):
    # 4 nodes x 2 ranks, one-peer exp2 (n = 8, D = 3): shift 1 puts one flow on each NIC, shifts 2 and 4 two
    # (both ranks of a node send off-node). Flow level: α + max(M/cap, flows·M/BW); no cap: α + flows·M/BW.
    nic = replace(NIC, flow_bandwidth_Bps=cap)
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=4, gpus_per_node=2, nic=nic, algorithm="neighbor", topology="one_peer_exp2",
                          iterations=3)
    sim = new_simulation(exp)
    sim.run()
    msgs = sim.algorithm.messages()
    inter = msgs[msgs.src // 2 != msgs.dst // 2]
    one = A + M / (BW if cap is None else min(cap, BW))
    for it, want in ((0, one), (1, A + shared), (2, A + shared)):
        d = inter[inter.iteration == it]
        assert np.allclose(d.end_s - d.start_s, want, rtol=1e-12), (it, want)


def test_buffered_sends_complete_a_rank_s_exchange_with_its_receives():
    """2 nodes x 2 ranks, one-peer exp2, first iteration (shift 1): rank 1 receives from rank 0 (same node: the intra
    link, 1 us + 4 MB at 100 GB/s = 41 us) and sends to rank 2 (the NIC: 1 + 4 = 5 ms). Delivered sends (MPI's
    rendezvous, the default): rank 1's exchange ends with its send, 5 ms, longer than backward (2 ms): iteration
    10 + 5 + 5 ms. Buffered (comm.buffered_sends: TCP, gloo): it ends with its receive, under backward: 10 + 2 + 5.
    Rank 0 receives from rank 3 over the NIC either way."""
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    intra = Link(1e-6, 1e11)
    ends = {}
    for buffered in (False, True):
        exp = make_experiment(trace, nodes=2, gpus_per_node=2, nic=NIC, algorithm="neighbor",
                              topology="one_peer_exp2", negotiate=False, buffered_sends=buffered, iterations=1)
        exp = replace(exp, cluster=replace(exp.cluster, intra=intra))
        ends[buffered] = simulate(exp).iterations().set_index("rank")["iteration_s"]
    assert ends[False][1] == pytest.approx(T_F + A + M / BW + T_OPT, rel=1e-9)
    assert ends[True][1] == pytest.approx(T_F + 0.002 + T_OPT, rel=1e-9)
    assert ends[True][0] == pytest.approx(ends[False][0], rel=1e-12) == pytest.approx(T_F + A + M / BW + T_OPT)


@pytest.mark.parametrize("n", [8, 12])
def test_one_peer_exp2_sends_one_model_sized_message_per_rank_per_iteration(n):
    sim, _ = run(0.002, nodes=n, algorithm="neighbor", topology="one_peer_exp2", iterations=5)
    msgs = sim.algorithm.messages()
    per = msgs.groupby(["iteration", "src"]).size()
    assert len(per) == 5 * n and (per == 1).all()
    assert (msgs.bytes == M).all()
    D = (n - 1).bit_length()
    assert (msgs.dst == (msgs.src + 2 ** (msgs.iteration % D)) % n).all()


def test_message_starts_when_sender_and_receiver_have_both_launched():
    # Samples mode with a slowed rank: every message starts at max(sender's, receiver's backward start) and the
    # optimizer step of a rank waits for all its sends and receives.
    rng = np.random.default_rng(1)
    samples = [(list(rng.uniform(1e-3, 5e-3, 3)), list(rng.uniform(1e-3, 5e-3, 3))) for _ in range(5)]
    trace = make_trace([0] * 3, [0] * 3, [300_000] * 3, samples=samples, optimizer=1e-3)
    exp = make_experiment(trace, nodes=8, gpus_per_node=1, nic=NIC, compute="samples", iterations=4,
                          algorithm="neighbor", topology="exp2", negotiate=False)
    exp = replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((3, 1.7),)))
    sim = new_simulation(exp)
    res = sim.run()
    df = res.intervals()
    launch = df[df.kind == "backward"].set_index(["rank", "iteration"])["start_s"]
    msgs = sim.algorithm.messages()
    expect = np.maximum(launch.loc[list(zip(msgs.src, msgs.iteration, strict=True))].to_numpy(),
                        launch.loc[list(zip(msgs.dst, msgs.iteration, strict=True))].to_numpy())
    assert np.allclose(msgs.start_s, expect, rtol=0, atol=1e-15)
    opt = df[df.kind == "optimizer"].set_index(["rank", "iteration"])["start_s"]
    bwd_end = df[df.kind == "backward"].set_index(["rank", "iteration"])["end_s"]
    last = dict(bwd_end.items())
    for m in msgs.itertuples():
        for r in (m.src, m.dst):
            last[(r, m.iteration)] = max(last[(r, m.iteration)], m.end_s)
    assert all(opt.loc[key] == pytest.approx(t, abs=1e-15) for key, t in last.items())


@pytest.mark.parametrize("negotiate", [True, False])
def test_negotiation_lets_a_straggler_hold_up_everyone(negotiate):
    # Ring of 8 ranks, rank 3 three times slower (forward 30 ms). With BlueFog's negotiation (its default) every
    # exchange waits until all ranks have requested it, so rank 6 (not a neighbour of 3) waits too; without it
    # rank 6 exchanges with its neighbours 5 and 7 as soon as they are ready.
    trace = make_trace([T_F], [0.002], [M // 4], optimizer=T_OPT)
    exp = make_experiment(trace, nodes=8, gpus_per_node=1, nic=NIC, iterations=1, algorithm="neighbor",
                          topology="ring", negotiate=negotiate)
    sim = new_simulation(replace(exp, heterogeneity=Heterogeneity(rank_slowdown=((3, 3.0),))))
    df = sim.run().intervals()
    opt6 = df[(df.kind == "optimizer") & (df["rank"] == 6)].start_s.iloc[0]
    # Ring: 2 peers, NIC shared 2 ways: 1 ms + 8 ms. Rank 3's exchange starts at its backward start, 30 ms.
    assert opt6 == pytest.approx((0.030 if negotiate else T_F) + A + 2 * M / BW, rel=1e-12)
    if negotiate:
        assert (sim.algorithm.messages().start_s == 0.030).all()


def test_hierarchical_neighbor_costs_node_average_exchange_and_broadcast():
    # 4 nodes x 2 ranks, collective "linear" (every intra collective costs a + b·M = 1 ms + 4 ms); local ranks 0
    # exchange over exp2 on 4 machines (2 peers: 1 ms + 2·4 ms = 9 ms): 5 + 9 + 5 = 19 ms after forward.
    a, b = 1e-3, 1e-9
    _, s = run(0.002, gpus=2, algorithm="hierarchical_neighbor", alpha=a, beta=b)
    assert s["iteration_time_s"] == pytest.approx(T_F + 2 * (a + b * M) + (A + 2 * M / BW) + T_OPT, rel=1e-12)
    assert s["topology"] == "exp2 over machines"
    assert s["spectral_gap"] == pytest.approx(topology("exp2", 4).spectral_gap(), rel=1e-12)


def test_hierarchical_neighbor_on_one_node_is_an_intra_node_average():
    _, s = run(0.002, nodes=1, gpus=4, algorithm="hierarchical_neighbor", alpha=1e-3, beta=1e-9)
    assert s["iteration_time_s"] == pytest.approx(T_F + 2 * (1e-3 + 1e-9 * M) + T_OPT, rel=1e-12)
    assert s["spectral_gap"] == 1.0


# --- BAGUA decentralized --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [4, 6, 8])
def test_shift_one_engine_sends_to_the_topology_pairs(n):
    sim, _ = run(0.002, nodes=n, algorithm="decentralized", topology="shift_one", iterations=n)
    msgs = sim.algorithm.messages()
    topo = topology("shift_one", n)
    for it in range(n):
        sent = set(zip(msgs[msgs.iteration == it].src, msgs[msgs.iteration == it].dst, strict=True))
        assert sent == {(e.rank, d) for e in topo.exchanges(it) for d in e.send_to}
        # shift_one pairs: every rank sends to the peer it receives from (BAGUA's rule, r < N/2 ↔ upper half).
        h = n // 2
        assert sent == {(r, (it + r) % h + h) for r in range(h)} | {((it + r) % h + h, r) for r in range(h)}


def test_shift_one_hierarchical_pairs_node_leaders():
    sim, s = run(0.002, nodes=4, gpus=2, algorithm="decentralized", topology="shift_one", iterations=2)
    msgs = sim.algorithm.messages()
    assert set(msgs.src) <= {0, 2, 4, 6} and set(msgs.dst) <= {0, 2, 4, 6}
    assert s["spectral_gap"] == pytest.approx(topology("shift_one", 4).spectral_gap(), rel=1e-12)


@pytest.mark.parametrize("t_b", [0.002, 0.050])
def test_bagua_decentralized_overlaps_forward_and_backward(t_b):
    # Launched at the forward pre-hook: the 41 ms exchange (1 ms + 40 MB at 1 GB/s) starts with forward.
    # t_b = 2 ms: max(10 + 2, 41) + 5 = 46 ms (AWC would take 10 + 41 + 5); t_b = 50 ms: 10 + 50 + 5 = 65 ms.
    _, s = run(t_b, elements=(10 * M // 4,), algorithm="decentralized", topology="shift_one")
    assert s["iteration_time_s"] == pytest.approx(max(T_F + t_b, A + 10 * M / BW) + T_OPT, rel=1e-12)


def test_bagua_decentralized_all_is_an_allreduce_of_the_weights():
    a, b = 2e-3, 1e-9  # linear allreduce: 2 + 4 = 6 ms, from the start of forward
    _, s = run(0.002, algorithm="decentralized", alpha=a, beta=b, hierarchical=False)
    assert s["iteration_time_s"] == pytest.approx(T_F + 0.002 + T_OPT, rel=1e-12)
    _, s = run(0.002, elements=(10 * M // 4,), algorithm="decentralized", alpha=a, beta=b, hierarchical=False)
    assert s["iteration_time_s"] == pytest.approx(a + b * 10 * M + T_OPT, rel=1e-12)
    assert s["topology"] == "full" and s["spectral_gap"] == 1.0 and s["iterations_to_consensus"] == 1


def test_bagua_decentralized_rejects_other_graphs():
    with pytest.raises(ConfigError, match="comm.topology"):
        run(0.002, algorithm="decentralized", topology="exp2")


def test_low_precision_decentralized_compresses_and_sends_to_both_ring_neighbours():
    # 4 ranks on 4 nodes, not hierarchical; wire = 1e6 uint8 (padded to 32) + 32 B of min/max = 1,000,032 B.
    # Encode 4 MB at 1 GB/s (4 ms), 2 messages at once (1 ms + 2 x 1.000032 ms), decode 3 x 4 MB (12 ms), placed
    # after backward: 10 + 2 + 4 + 3.000064 + 12 + 5 = 36.000064 ms.
    wire = 1_000_032
    assert minmax_uint8_bytes(M // 4, 1) == wire
    sim, s = run(0.002, algorithm="low_precision_decentralized", encode_bandwidth_Bps=1e9)
    expected = T_F + 0.002 + M / 1e9 + (A + 2 * wire / BW) + 3 * M / 1e9 + T_OPT
    assert s["iteration_time_s"] == pytest.approx(expected, rel=1e-12)
    msgs = sim.algorithm.messages()
    assert set(zip(msgs.src, msgs.dst, strict=True)) == {(r, (r + k) % 4) for r in range(4) for k in (1, 3)}
    assert (msgs.bytes == wire).all()
    assert s["spectral_gap"] == pytest.approx(topology("ring", 4).spectral_gap(), rel=1e-12)


# --- mixing quality, configuration, scale -------------------------------------------------------------------------

def test_mixing_quality_in_the_summary():
    _, s = run(0.002, nodes=8, algorithm="neighbor", consensus_eps=1e-3)
    topo = topology("exp2", 8)
    assert s["topology"] == "exp2" and s["consensus_eps"] == 1e-3
    assert s["spectral_gap"] == pytest.approx(topo.spectral_gap(), rel=1e-12)
    assert s["iterations_to_consensus"] == topo.iterations_to_consensus(1e-3)
    # exp2 on 8 ranks (offsets 1, 2, 4, weights 1/4): eigenvalues (1 + ω^k + ω^2k + ω^4k)/4 with ω = e^(2πi/8); the
    # largest modulus off k = 0 is at k = 4 (ω^4 = −1): (1 − 1 + 1 + 1)/4 = 1/2, so the gap is 1/2.
    assert s["spectral_gap"] == pytest.approx(0.5, rel=1e-12)
    allreduce = simulate(make_experiment(make_trace([0.01], [0.02], [1000]))).summary()
    assert allreduce["spectral_gap"] is None and allreduce["topology"] is None


def test_one_rank_has_nothing_to_exchange():
    for alg in ("neighbor", "hierarchical_neighbor", "decentralized", "low_precision_decentralized"):
        _, s = run(0.002, nodes=1, algorithm=alg)
        assert s["iteration_time_s"] == pytest.approx(T_F + 0.002 + T_OPT) and s["comm_s"] == 0


def test_split_by_iteration():
    starts = [0.0, 1.0, 2.0]
    assert split_by_iteration(starts, 2, 0.5, 2.5) == [(0, 0.5, 1.0), (1, 1.0, 2.0), (2, 2.0, 2.5)]
    assert split_by_iteration(starts, 2, 2.1, 2.5) == [(2, 2.1, 2.5)]


TOML = """
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 4
nic_bandwidth = "1GB/s"
[comm]
algorithm = "neighbor"
{extra}
"""


def load_with_comm(folder, extra: str):
    """Load an experiment whose [comm] section has the extra lines (a helper shared by the algorithm tests)."""
    make_trace([0.01], [0.02], [1000]).save(folder / "t.json")
    path = folder / "exp.toml"
    path.write_text(TOML.format(extra=extra))
    return experiment.load(path)


def test_comm_keys_parse(tmp_path):
    exp = load_with_comm(tmp_path, 'topology = "one_peer_exp2"\ncombine = "atc"\nconsensus_eps = 0.001\n'
                                   "hierarchical = false\nnegotiate = false")
    c = exp.comm
    assert (c.topology, c.combine, c.consensus_eps, c.hierarchical, c.negotiate) == ("one_peer_exp2", "atc", 0.001,
                                                                                     False, False)
    assert simulate(exp).summary()["topology"] == "one_peer_exp2"


@pytest.mark.parametrize("extra, field", [
    ('topology = "torus"', "comm.topology"), ('combine = "cta"', "comm.combine"),
    ("consensus_eps = 1.5", "comm.consensus_eps"), ('hierarchical = "yes"', "comm.hierarchical"),
    ("negotiate = 1", "comm.negotiate"), ("buffered_sends = \"yes\"", "comm.buffered_sends"),
])
def test_bad_comm_keys_name_the_field(tmp_path, extra, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_with_comm(tmp_path, extra)


def test_2048_ranks_one_peer_exp2_completes():
    trace = make_trace([0.01] * 4, [0.02] * 4, [200_000] * 4, optimizer=1e-3)
    exp = make_experiment(trace, nodes=256, gpus_per_node=8, collective="ring", iterations=3,
                          algorithm="neighbor", topology="one_peer_exp2")
    sim = new_simulation(exp)
    s = sim.run().summary()
    assert s["ranks"] == 2048 and s["spectral_gap"] == 1.0 and s["iterations_to_consensus"] == 11
    assert len(sim.algorithm.messages()) == 3 * 2048
