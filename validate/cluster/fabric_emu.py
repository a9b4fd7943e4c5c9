"""Emulated switch tiers: nodes on leaf bridges, leaves joined through a spine bridge by shaped uplinks, and several
jobs on one such cluster.

Layout (validate.cluster.netemu's, with the one bridge split into leaves):

    namespace <run>-sw   bridge "<prefix>-br" (netemu's, here the spine); per leaf j a bridge "<prefix>-l<j>" and a
                         veth pair "<prefix>-u<j>" (on the leaf) / "<prefix>-d<j>" (on the spine), both ends in
                         this namespace; node i's port "<prefix>-p<i>" on its leaf's bridge
    namespace <run>-n<i> node i, as in netemu (its NIC shaped by tbf each way)

Leaf j's uplink is the veth pair between its bridge and the spine's: tbf on "<prefix>-u<j>" shapes what the leaf
sends up, tbf on "<prefix>-d<j>" what comes down to it, each at `uplink_bandwidth_Bps`, so the uplink carries at
most its rate in each direction and every flow between leaves crosses two uplinks (up its source leaf's, down its
destination leaf's), as in a two-tier Clos. Bucket and queue sizes follow netemu's rules (rate × BURST_S and
rate × QUEUE_S, with its floors). Every interface lives in the switch or a node namespace, and the namespaces are
named as netemu names them, so netemu's teardown, its supervisor journal entry (remove_run: a kill -9 of the owner
leaves nothing) and cleanup_leftovers remove a tiered cluster whole.

Jobs: `jobs` splits the nodes into disjoint groups; `job(k)` is a view of job k's nodes, numbered 0.. in the job's
order, that the launchers take as a cluster (nodes, run_in, shaped, nic_bandwidth_Bps, shaper_stats), so two jobs
start their ranks on one emulated fabric at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from simfog.errors import ConfigError
from simfog.fabric import FatTree
from validate.cluster import netemu
from validate.cluster.netemu import BURST_S, MIN_BURST_BYTES, MIN_LIMIT_BYTES, MTU, QUEUE_S, NodeSpec, _sh

LEAF_IFNAME = "{prefix}-l{leaf}"
UP_IFNAME = "{prefix}-u{leaf}"  # leaf end of leaf j's uplink: its egress is what the leaf sends up
DOWN_IFNAME = "{prefix}-d{leaf}"  # spine end: its egress is what comes down to leaf j
MOST_LEAVES = 64


class TieredCluster(netemu.EmulatedCluster):
    """`leaves` leaves of `nodes_per_leaf` nodes (node i on leaf i // nodes_per_leaf), NICs at `nic_bandwidth_Bps`
    and each leaf's uplink at `uplink_bandwidth_Bps` (bytes/s, each direction); `jobs` the nodes of each job (default
    one job of all). Other keywords go to netemu.EmulatedCluster. A context manager, as EmulatedCluster."""

    def __init__(self, leaves: int, nodes_per_leaf: int, nic_bandwidth_Bps: float, uplink_bandwidth_Bps: float, *,
                 jobs: Sequence[Sequence[int]] | None = None, **kwargs):
        if isinstance(leaves, bool) or not isinstance(leaves, int) or not 2 <= leaves <= MOST_LEAVES:
            raise ConfigError("fabric.leaves", leaves, f"an integer from 2 to {MOST_LEAVES} for emulated tiers")
        if isinstance(nodes_per_leaf, bool) or not isinstance(nodes_per_leaf, int) or nodes_per_leaf < 1:
            raise ConfigError("fabric.nodes_per_leaf", nodes_per_leaf, "an integer >= 1")
        super().__init__(leaves * nodes_per_leaf, nic_bandwidth_Bps, **kwargs)
        if not uplink_bandwidth_Bps > 0:
            raise ConfigError("fabric.leaf_uplink_bandwidth", uplink_bandwidth_Bps, "a bandwidth > 0")
        self.leaves, self.nodes_per_leaf = leaves, nodes_per_leaf
        self.uplink_bandwidth_Bps = float(uplink_bandwidth_Bps)
        self.uplink_burst_bytes = int(max(MIN_BURST_BYTES, self.uplink_bandwidth_Bps * BURST_S))
        self.uplink_limit_bytes = int(max(MIN_LIMIT_BYTES, self.uplink_bandwidth_Bps * QUEUE_S))
        self.jobs = _check_jobs(jobs, len(self.nodes))

    @classmethod
    def for_fabric(cls, fabric, **kwargs) -> TieredCluster:
        """The emulated tiers of a two-tier simfog.fabric.FatTree with one NIC per node: its leaves, nodes per leaf,
        NIC rate, and each leaf's uplinks as one shaped link of their summed rate: exact for ECMP "split"; under
        "hash" the collisions of flows on one of the real links are not emulated. Raises ConfigError for anything
        else."""
        if not isinstance(fabric, FatTree) or fabric.tiers != 2:
            raise ConfigError("fabric.kind", type(fabric).__name__, "a two-tier fat_tree for emulated tiers")
        if fabric.nics_per_node != 1:
            raise ConfigError("nics_per_node", fabric.nics_per_node, "1 for emulated tiers (one NIC per namespace)")
        return cls(fabric.leaves, fabric.nodes_per_leaf, fabric.nic_Bps,
                   fabric.leaf_uplinks * fabric.leaf_uplink_Bps, **kwargs)

    def leaf_of(self, node: int) -> int:
        return node // self.nodes_per_leaf

    def job(self, k: int) -> JobView:
        """Job k's nodes as a cluster of their own (module docstring)."""
        return JobView(self, self.jobs[k])

    # -- building (netemu's __enter__ calls these) ------------------------------------------------------------
    def _names(self, leaf: int) -> tuple[str, str, str]:
        p = self.prefix
        return LEAF_IFNAME.format(prefix=p, leaf=leaf), UP_IFNAME.format(prefix=p, leaf=leaf), \
            DOWN_IFNAME.format(prefix=p, leaf=leaf)

    def _shape(self, ns: str, dev: str, rate_Bps: float, burst: int, limit: int) -> None:
        _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(round(rate_Bps * 8))}bit",
            "burst", str(burst), "limit", str(limit))

    def _build(self) -> None:
        """netemu's one-bridge cluster, whose bridge becomes the spine: each node's port moves onto its leaf's
        bridge, and each leaf's bridge joins the spine through its shaped uplink."""
        super()._build()
        sw, spine = self.switch, netemu.BRIDGE_IFNAME.format(prefix=self.prefix)
        for leaf in range(self.leaves):
            bridge, up, down = self._names(leaf)
            _sh("ip", "-n", sw, "link", "add", "name", bridge, "type", "bridge")
            _sh("ip", "-n", sw, "link", "set", "dev", bridge, "up")
            _sh("ip", "-n", sw, "link", "add", "name", up, "mtu", str(MTU), "type", "veth", "peer", "name", down,
                "mtu", str(MTU))
            _sh("ip", "-n", sw, "link", "set", "dev", up, "master", bridge)
            _sh("ip", "-n", sw, "link", "set", "dev", down, "master", spine)
            for dev in (up, down):
                _sh("ip", "-n", sw, "link", "set", "dev", dev, "up")
                self._shape(sw, dev, self.uplink_bandwidth_Bps, self.uplink_burst_bytes, self.uplink_limit_bytes)
        for node in self.nodes:
            port = netemu.PORT_IFNAME.format(prefix=self.prefix, index=node.index)
            _sh("ip", "-n", sw, "link", "set", "dev", port, "master", self._names(self.leaf_of(node.index))[0])

    def _verify(self) -> None:
        """netemu's checks (every NIC shaped both ways, node 0 reaches every node: across the uplinks too), and
        every uplink shaped both ways."""
        for leaf in range(self.leaves):
            for dev in self._names(leaf)[1:]:
                if " tbf " not in _sh("tc", "-n", self.switch, "qdisc", "show", "dev", dev).stdout:
                    raise netemu.NetemuError(f"no tbf qdisc on uplink {dev} in namespace {self.switch}")
        super()._verify()

    def uplink_stats(self) -> list[dict]:
        """Per leaf: bytes sent and packets dropped by its uplink's up and down shapers."""
        def one(dev):
            q = json.loads(_sh("tc", "-s", "-j", "-n", self.switch, "qdisc", "show", "dev", dev).stdout)[0]
            return {"sent_bytes": q.get("bytes", 0), "dropped_packets": q.get("drops", 0)}

        return [{"leaf": leaf, "up": one(self._names(leaf)[1]), "down": one(self._names(leaf)[2])}
                for leaf in range(self.leaves)]


class JobView:
    """One job's nodes of a TieredCluster, numbered 0.. in the job's order: what the launchers take as a cluster."""

    shaped = True

    def __init__(self, cluster: TieredCluster, members: tuple[int, ...]):
        self.cluster, self.members = cluster, members
        self.nodes = tuple(NodeSpec(k, cluster.nodes[i].namespace, cluster.nodes[i].address, cluster.nodes[i].ifname)
                           for k, i in enumerate(members))
        self.nic_bandwidth_Bps = cluster.nic_bandwidth_Bps

    def run_in(self, node: int, argv, **popen_kwargs):
        """Starts `argv` in the job's node `node` (the cluster's node members[node])."""
        return self.cluster.run_in(self.members[node], argv, **popen_kwargs)

    def shaper_stats(self) -> list[dict]:
        stats = self.cluster.shaper_stats()
        return [{**stats[i], "node": k} for k, i in enumerate(self.members)]


def _check_jobs(jobs: Sequence[Sequence[int]] | None, nodes: int) -> tuple[tuple[int, ...], ...]:
    if jobs is None:
        return (tuple(range(nodes)),)
    out, seen = [], set()
    for k, job in enumerate(jobs):
        members = tuple(job)
        if not members:
            raise ConfigError(f"jobs[{k}]", list(job), "at least one node")
        for v in members:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < nodes:
                raise ConfigError(f"jobs[{k}]", v, f"a node in 0..{nodes - 1}")
            if v in seen:
                raise ConfigError(f"jobs[{k}]", v, "a node of no other job (each node in one job)")
            seen.add(v)
        out.append(members)
    return tuple(out)
