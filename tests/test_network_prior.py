"""The prior of links nobody measured (simfog.nccl.prior): what a transport delivers of its nominal rate, applied to
an experiment's links when it states the transport, and the band every run on unmeasured links carries."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from simfog import cli, experiment
from simfog.bands import LEVELS
from simfog.errors import ConfigError
from simfog.nccl import NcclNetwork, derived_bus_Bps
from simfog.nccl import prior as prior_module
from simfog.nccl.clusters import TRANSPORTS
from simfog.nccl.prior import POOLED, prior, priors, unmeasured_network
from simfog.run_bands import network_part

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "simfog" / "data" / "resnet50-a100-b32-estimated.json.gz"


def _exp(tmp_path: Path, cluster: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f'seed = 1\niterations = 2\n[workload]\ntrace = "{TRACE}"\ncompute = "mean"\n[cluster]\nnodes = 4\n'
                    f'gpus_per_node = 8\nnic_bandwidth = "25Gbit/s"\n{cluster}\n[comm]\nmerge = "ddp"\n')
    return path


def test_the_shipped_prior_has_every_transport_and_says_where_it_has_no_data():
    table = priors()
    assert set(table) == {*TRANSPORTS, POOLED}
    for t in TRANSPORTS:
        p = table[t]
        assert 0 < p.efficiency <= 1.5 and p.latency_inter_s >= 0
        if p.learned:
            assert p.clusters and p.widths.source.startswith(str(sum(p.widths.points.values())))
            assert "its transport's prior learned without it" in p.widths.source
        else:  # no public cluster of it: the pooled prior and the band of predictions made with it
            assert (p.efficiency, p.clusters) == (table[POOLED].efficiency, table[POOLED].clusters)
            assert "no public data" in p.describe() and "pooled prior" in p.widths.source
    assert table["tcp"].learned and table["tcp"].efficiency < table["ib"].efficiency  # sockets deliver less
    assert "at most 30.89 Gbit/s per NIC" in table["tcp"].describe()  # the shipped table's cap
    assert not table["efa"].learned and not table["roce"].learned  # no public log of 3+ nodes today


def test_stating_the_transport_makes_the_links_deliver_what_the_prior_says(tmp_path):
    ib, tcp = prior("ib"), prior("tcp")
    exp = experiment.load(_exp(tmp_path, 'transport = "ib"'))
    assert exp.transport == "ib" and ib.cap_Bps is None  # RDMA: a fraction of the line rate
    assert exp.cluster.nic.bandwidth_Bps == pytest.approx(25e9 / 8 * ib.efficiency, rel=1e-12)
    assert exp.cluster.nic.latency_s == ib.latency_inter_s  # no nic_latency given: the prior's
    # TCP sockets: bound by the CPU, at most the cap per NIC (learned on 200 Gbit/s NICs): a slower line is the limit
    assert tcp.cap_Bps is not None and 25e9 / 8 < tcp.cap_Bps < 100e9 / 8
    assert experiment.load(_exp(tmp_path, 'transport = "tcp"')).cluster.nic.bandwidth_Bps == 25e9 / 8
    fast = _exp(tmp_path, 'transport = "tcp"').read_text().replace("25Gbit/s", "100Gbit/s")
    (tmp_path / "fast.toml").write_text(fast)
    assert experiment.load(tmp_path / "fast.toml").cluster.nic.bandwidth_Bps == tcp.cap_Bps
    given = experiment.load(_exp(tmp_path, 'transport = "ib"\nnic_latency = "7us"'))
    assert given.cluster.nic.latency_s == 7e-6
    plain = experiment.load(_exp(tmp_path, ""))
    assert plain.transport is None and plain.cluster.nic.bandwidth_Bps == 25e9 / 8  # nothing stated: as written


def test_a_transport_beside_a_measured_network_or_an_unknown_one_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cluster.transport = 'infiniband': one of ib, roce, efa, slingshot, tcp"):
        experiment.load(_exp(tmp_path, 'transport = "infiniband"'))
    with pytest.raises(ConfigError, match="cluster.transport = 'tcp': only for links nobody measured"):
        experiment.load(_exp(tmp_path, 'transport = "tcp"\nnetwork = "abci-a100"'))


def test_a_run_on_links_nobody_measured_carries_the_priors_band(tmp_path):
    exp = experiment.load(_exp(tmp_path, 'transport = "tcp"'))
    sizes = [2**10, 2**26]
    part = network_part(exp, [{"bytes": s} for s in sizes], 0.9, None)
    widths = prior("tcp").widths
    want = max(widths.half_width(s, 0.9) for s in sizes)
    assert (part.below, part.above, part.measured) == (want, want, False)
    assert "the prior of tcp links deliver at most" in part.source and "held out by cluster" in part.source
    unstated = network_part(experiment.load(_exp(tmp_path, "")), [{"bytes": 2**26}], 0.9, None)
    assert unstated.below == prior(None).widths.half_width(2**26, 0.9)
    assert "unstated transport" in unstated.source
    too_high = prior_module.network_part("tcp", [2**26], 0.999)  # no stored level reaches: unmeasured, never narrower
    assert too_high.below == max(math.log(2), widths.widest(2**26)) and LEVELS[-1] < 0.999


def test_the_summary_states_the_transport(tmp_path, capsys):
    assert cli.main(["simulate", str(_exp(tmp_path, 'transport = "tcp"')), "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["transport"] == "tcp"
    assert cli.main(["simulate", str(_exp(tmp_path, 'transport = "tcp"'))]) == 0
    assert "links from the experiment: tcp links deliver" in capsys.readouterr().out


def test_the_unmeasured_network_scales_the_nominal_rate_and_derives_the_rest():
    hw = NcclNetwork(1e9, 1e9, version="2.21", nics_per_node=4, nic_Bps=25e9)
    net = unmeasured_network(hw, prior("ib"))
    assert net.inter_bus_Bps == pytest.approx(prior("ib").efficiency * 4 * 25e9)
    assert unmeasured_network(hw, prior("tcp")).inter_bus_Bps == 4 * min(25e9, prior("tcp").cap_Bps)
    assert net.intra_bus_Bps == derived_bus_Bps(hw, nodes=1) and net.channels is None and net.launch_s == 0
    with pytest.raises(ConfigError, match="nics_per_node"):
        unmeasured_network(NcclNetwork(1e9, 1e9), prior("ib"))
