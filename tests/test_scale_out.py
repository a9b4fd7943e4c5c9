"""Scale-out from the fabric (simfog.nccl.scale_out): what a cluster's switches leave of its NICs to NCCL's patterns
as the node count grows, on simfog.fabric's fat trees and rail-optimized fabrics, and how the NCCL model uses it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from simfog import nccl, network_file
from simfog.errors import ConfigError
from simfog.nccl import p2p
from simfog.nccl.scale_out import FabricSpec, pattern_of, rate_factor

REPO = Path(__file__).resolve().parents[1]
RAIL = FabricSpec("rail", 32, 32)


def test_without_a_fabric_a_pattern_or_a_second_node_nothing_is_taken():
    assert rate_factor(None, "sendrecv", 16, 8, 8) == 1.0
    assert rate_factor(RAIL, None, 16, 8, 8) == 1.0
    assert rate_factor(RAIL, "sendrecv", 1, 8, 8) == 1.0
    assert (pattern_of("sendrecv", "p2p"), pattern_of("allreduce", "tree"), pattern_of("allgather", "ring"),
            pattern_of("allreduce", "nvls"), pattern_of("alltoall", "p2p")) == ("sendrecv", "tree", "ring", None, None)


def test_one_oversubscribed_uplink_shares_every_cross_rail_flow():
    """Rail switches of 32 nodes with ONE uplink carrying a single NIC's rate (oversubscription 32): nccl-tests'
    sendrecv ring sends from the last GPU's rail to the first GPU's on every node boundary, so all n flows cross
    that uplink: each gets 1/n of a NIC (closed form), whatever the placement."""
    one = FabricSpec("rail", 32, 1, oversubscription=32.0)
    for n in (2, 4, 16):
        assert rate_factor(one, "sendrecv", n, 8, 8) == pytest.approx(1 / n)
    assert rate_factor(one, "sendrecv", 8, 1, 8) == 1.0  # one GPU a node: NIC 0 to NIC 0, on its own rail switch
    assert rate_factor(one, "ring", 8, 8, 8) == 1.0      # channel c from NIC c to NIC c: rail-local


def test_hashed_collisions_grow_with_the_flows_and_split_routing_has_none():
    """32 uplinks, flows hashed onto them: two flows collide with probability 1/32 (E[1/rate] = 1 + 1/32 over random
    placements: factor about 0.97), sixteen almost surely; an even split over the paths never collides."""
    f = [rate_factor(RAIL, "sendrecv", n, 8, 8) for n in (2, 4, 8, 16, 64)]
    assert f == sorted(f, reverse=True) and f[0] == pytest.approx(32 / 33, abs=0.03) and f[-1] < 0.5
    split = replace(RAIL, ecmp="split")
    assert [rate_factor(split, "sendrecv", n, 8, 8) for n in (2, 16, 64)] == [1.0, 1.0, 1.0]


def test_the_nccl_model_takes_the_factor_and_ncclS_own_estimate_does_not():
    net = nccl.NcclNetwork(200e9, 100e9, nics_per_node=8, nic_Bps=50e9, version="2.29", gpu_arch="blackwell")
    on = replace(net, fabric=RAIL)
    f = rate_factor(RAIL, "sendrecv", 16, 8, 8)
    lat, _, nic = p2p.rates(net, 16)
    assert p2p.time_s("sendrecv", 2**26, 128, 16, on) == pytest.approx(lat + 2**26 / (nic * f))
    assert p2p.time_s("sendrecv", 2**26, 128, 16, net) == pytest.approx(lat + 2**26 / nic)
    assert nccl.estimate_s("allreduce", 2**26, 128, 16, on, "tree", "Simple") == \
        nccl.estimate_s("allreduce", 2**26, 128, 16, net, "tree", "Simple")  # NCCL's tuner knows no fabric


def test_the_spec_is_checked_and_round_trips_through_a_network_file(tmp_path):
    for key, bad in (("kind", "torus"), ("uplinks", 0), ("oversubscription", 0.5), ("ecmp", "random")):
        with pytest.raises(ConfigError, match=f"scale_out.{key}"):
            FabricSpec.from_toml({**RAIL.to_toml(), key: bad})
    with pytest.raises(ConfigError, match="a table of kind, nodes_per_leaf, uplinks"):
        FabricSpec.from_toml({"kind": "rail"})
    net = replace(network_file.load(REPO / "simfog" / "data" / "clusters" / "abci-v100.toml").nccl,
                  fabric=replace(RAIL, source="inferred"))
    network_file.save(tmp_path / "n.toml", net)
    assert network_file.load(tmp_path / "n.toml").nccl == net


def test_the_corpus_gives_an_inferred_fabric_to_the_calibration():
    sys.path.insert(0, str(REPO / "bench"))
    import nccl_corpus

    clusters = {c.name: c for c in nccl_corpus.discover(REPO / "bench" / "data" / "nccl-tests")}
    kwargs, _, used, _ = nccl_corpus.fit_arguments(clusters["together-b200-ib"].facts)
    assert kwargs["fabric"] == FabricSpec("rail", 32, 32) and any(u.startswith("scale_out=rail") for u in used)
    assert "fabric" not in nccl_corpus.fit_arguments(clusters["polaris-a100-ofi"].facts)[0]  # adaptive: none
