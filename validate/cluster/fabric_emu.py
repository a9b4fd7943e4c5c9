"""Emulated switch tiers: nodes on leaf bridges, leaves joined through a spine bridge by shaped uplinks, and several
jobs on one such cluster.

Layout (validate.cluster.netemu's, with the one bridge split into leaves):

    namespace <run>-sw   bridge "<prefix>-br" (netemu's, here the spine); per leaf j a bridge "<prefix>-l<j>" and a
                         veth pair "<prefix>-u<j>" (on the leaf) / "<prefix>-d<j>" (on the spine), both ends in
                         this namespace; node i's port "<prefix>-p<i>" on its leaf's bridge
    namespace <run>-n<i> node i, as in netemu (its NIC shaped by tbf each way)

Leaf j's uplink is the veth pair between its bridge and the spine's: an htb shaper on "<prefix>-u<j>" shapes what
the leaf sends up, one on "<prefix>-d<j>" what comes down to it, each at `uplink_bandwidth_Bps`, so the uplink
carries at most its rate in each direction and every flow between leaves crosses two uplinks (up its source leaf's,
down its destination leaf's), as in a two-tier Clos. The uplink shares its rate fairly among the node pairs whose
traffic crosses it: one htb class per (source node, destination node) pair, all of equal rate and quantum, each
borrowing what the others leave (max-min fair, as simfog.fabric shares a link), as a switch that arbitrates round
robin among its flows (InfiniBand's arbitration) does. One FIFO (tbf's) does not: TCP flows through one queue split
it by their window and round-trip time, and two jobs crossing one uplink were measured slowed 1.80 and 1.43 times
where an even split gives 1.66 and 1.66. Bucket and queue sizes follow netemu's rules (rate × BURST_S and rate ×
QUEUE_S, with its floors), the queue per class. Every interface lives in the switch or a node namespace, and the
namespaces are named as netemu names them, so netemu's teardown, its supervisor journal entry (remove_run: a kill -9
of the owner leaves nothing) and cleanup_leftovers remove a tiered cluster whole.

Jobs: `jobs` splits the nodes into disjoint groups; `job(k)` is a view of job k's nodes, numbered 0.. in the job's
order, that the launchers take as a cluster (nodes, run_in, shaped, nic_bandwidth_Bps, shaper_stats), so two jobs
start their ranks on one emulated fabric at once.

Calibration (validate.calibration) measures the NICs, and simfog.fabric predicts what the uplinks do on top: so the
microbenchmarks run with the uplinks lifted (`uplinks_lifted`: their shapers removed, the NICs still shaped), else a
placement whose ring crosses a leaf twice would be counted twice, once in the fitted NIC rate and once by the fabric.
`open_job` opens the tiered cluster of an experiment on a two-tier fat tree and yields its job's view.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence

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

    def _crossing_pairs(self, leaf: int, up: bool) -> list[tuple[str, str]]:
        """(source, destination) addresses of the node pairs whose traffic crosses leaf's uplink, up or down."""
        inside = [n.address for n in self.nodes if self.leaf_of(n.index) == leaf]
        outside = [n.address for n in self.nodes if self.leaf_of(n.index) != leaf]
        return [(a, b) for a in inside for b in outside] if up else [(b, a) for a in inside for b in outside]

    def _shape_uplink(self, leaf: int, up: bool) -> None:
        """htb at the uplink's rate, one class per crossing pair (module docstring); what no pair matches (ARP)
        goes to a class of its own at the same terms."""
        dev = self._names(leaf)[1 if up else 2]
        pairs = self._crossing_pairs(leaf, up)
        rate = self.uplink_bandwidth_Bps

        def bits(bps: float) -> str:
            return f"{max(8, int(round(bps * 8)))}bit"

        share = rate / (len(pairs) + 1)
        burst = str(self.uplink_burst_bytes)
        tc = ("tc", "-n", self.switch)
        _sh(*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "2")
        _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", bits(rate),
            "ceil", bits(rate), "burst", burst, "cburst", burst)
        for k, pair in enumerate([None, *pairs], start=2):
            _sh(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{k:x}", "htb", "rate", bits(share),
                "ceil", bits(rate), "burst", burst, "cburst", burst, "quantum", str(MTU + 14))
            _sh(*tc, "qdisc", "add", "dev", dev, "parent", f"1:{k:x}", "bfifo", "limit", str(self.uplink_limit_bytes))
            if pair is not None:
                _sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                    "match", "ip", "src", f"{pair[0]}/32", "match", "ip", "dst", f"{pair[1]}/32", "flowid", f"1:{k:x}")

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
            self._shape_uplink(leaf, up=True)
            self._shape_uplink(leaf, up=False)
        for node in self.nodes:
            port = netemu.PORT_IFNAME.format(prefix=self.prefix, index=node.index)
            _sh("ip", "-n", sw, "link", "set", "dev", port, "master", self._names(self.leaf_of(node.index))[0])

    def _verify(self) -> None:
        """netemu's checks (every NIC shaped both ways, node 0 reaches every node: across the uplinks too), and
        every uplink shaped both ways."""
        for leaf in range(self.leaves):
            for dev in self._names(leaf)[1:]:
                if " htb " not in _sh("tc", "-n", self.switch, "qdisc", "show", "dev", dev).stdout:
                    raise netemu.NetemuError(f"no htb qdisc on uplink {dev} in namespace {self.switch}")
        super()._verify()

    @contextlib.contextmanager
    def uplinks_lifted(self) -> Iterator[None]:
        """For the block, the uplinks carry whatever the NICs send (their shapers removed; module docstring); shaped
        again on leaving it, whatever happens inside."""
        devs = [dev for leaf in range(self.leaves) for dev in self._names(leaf)[1:]]
        try:
            for dev in devs:
                _sh("tc", "-n", self.switch, "qdisc", "del", "dev", dev, "root")
            yield
        finally:
            if not self._torn_down:
                for dev in devs:
                    _sh("tc", "-n", self.switch, "qdisc", "del", "dev", dev, "root", check=False)
                for leaf in range(self.leaves):
                    self._shape_uplink(leaf, up=True)
                    self._shape_uplink(leaf, up=False)

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

    def uplinks_lifted(self):
        return self.cluster.uplinks_lifted()


def check_fabric(shape, *, launcher: str = "local", backend: str = "gloo", source: str | None = None) -> None:
    """Raise ConfigError naming `source` unless the emulated tiers can run `shape`'s fabric: a two-tier fat tree with
    one NIC per node, at most MOST_LEAVES leaves, ranks started here (local launcher) on gloo."""
    fabric = shape.fabric.fabric
    kind = type(fabric).__name__
    if not isinstance(fabric, FatTree) or fabric.tiers != 2:
        tiers = f" of {fabric.tiers} tiers" if isinstance(fabric, FatTree) else ""
        raise ConfigError("fabric.kind", f"{kind}{tiers}", "a two-tier fat_tree for simfog validate (the emulated "
                          "cluster has leaf switches and one spine)", source=source)
    if fabric.nics_per_node != 1:
        raise ConfigError("fabric", f"{fabric.nics_per_node} NICs per node", "one NIC per node for simfog validate "
                          "(one emulated NIC per namespace)", source=source)
    if not 2 <= fabric.leaves <= MOST_LEAVES or fabric.nodes > netemu.MOST_NODES:
        raise ConfigError("fabric.leaves", fabric.leaves, f"2 to {MOST_LEAVES} leaves of at most "
                          f"{netemu.MOST_NODES} nodes in all for the emulated tiers", source=source)
    if launcher != "local" or backend != "gloo":
        raise ConfigError("fabric", kind, "--launcher local and --backend gloo (the emulated switch tiers are "
                          "namespaces on this machine)", source=source)


def fabric_keys(shape) -> dict:
    """A row's `fabric` and `placement`: the tiers as emulated and the job's nodes in rank order ("" for none)."""
    if shape.fabric is None:
        return {}
    fabric, nodes = fabric_nodes(shape)
    view = shape.fabric
    rule = view.placement if isinstance(view.placement, str) else "given"
    seed = f" seed {view.placement_seed}" if rule == "scattered" else ""
    over = fabric.nodes_per_leaf * fabric.nic_Bps / (fabric.leaf_uplinks * fabric.leaf_uplink_Bps)
    return {"fabric": f"fat_tree {fabric.leaves} leaves x {fabric.nodes_per_leaf} nodes, uplink "
                      f"{fabric.leaf_uplinks * fabric.leaf_uplink_Bps * 8 / 1e6:g} Mbit/s ({over:g}:1)",
            "placement": f"{rule}{seed}: nodes {' '.join(map(str, nodes))}"}


def fabric_nodes(shape) -> tuple[FatTree, tuple[int, ...]]:
    """(fabric, the job's fabric nodes in rank order) of a simfog.cluster.Cluster on a non-flat fabric."""
    return shape.fabric.fabric, shape.fabric.nodes(shape.nodes).nodes


@contextlib.contextmanager
def open_job(shape, *, prefix: str = "sf") -> Iterator[JobView]:
    """The TieredCluster of `shape`'s fabric (a simfog.cluster.Cluster whose `fabric` is a two-tier fat tree), its
    job's nodes placed as the experiment places them, and yields the job's view. A fabric needs the emulated
    network (validate.run refuses --loopback with one): NetemuError when it cannot be built here."""
    ok, why = netemu.available()
    if not ok:
        raise netemu.NetemuError(f"a [fabric] needs the emulated network: {why}")
    fabric, nodes = fabric_nodes(shape)
    with TieredCluster.for_fabric(fabric, jobs=[nodes], prefix=prefix) as cluster:
        yield cluster.job(0)


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
