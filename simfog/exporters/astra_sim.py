"""An experiment's cluster and collective as ASTRA-sim 2.x's analytical-backend inputs: the network (YAML), the
system (JSON) and the remote memory (JSON), so the workload `simfog export chakra` writes runs on the same
configuration in both simulators.

What each value is, read from ASTRA-sim's source (astra-sim/astra-sim, with its analytical network backend
astra-network-analytical; the commit bench/peers.py pins):

- network: one dimension per level of the collective. "ring" is one ring over every rank: one dimension, of the
  link a ring step waits for (simfog's step is max(intra, inter) over the hops of a ring laid out node by node;
  the dimension takes the inter-node link when the ring spans nodes, which holds whenever the NIC is the slower
  link in latency and bandwidth, and is an approximation otherwise). "hierarchical" is two dimensions, the
  intra-node ring of L ranks and the inter-node ring of m nodes; ASTRA-sim gives every NPU its own link in each
  dimension, so the inter-node dimension gets the NIC's bandwidth divided among the node's L ranks (simfog's L
  rings sharing the NIC). Topology "Ring": a ring step is one hop, so a message of M bytes costs latency + M /
  bandwidth, as simfog's Link. Bandwidths are in ASTRA-sim's "GB/s" (2**30 bytes per second:
  NetworkFunction.cpp bw_GBps_to_Bpns), latencies in ns.
- system: the "ring" collective on each dimension; one chunk per collective ("preferred-dataset-splits": 1) and
  one chunk in flight per dimension, so a collective is the α-β ring simfog costs, not a pipeline of chunks;
  "endpoint-delay": 1 ns per message, the least ASTRA-sim accepts (0 stops its event queue: an event at the time
  it is scheduled); "collective-optimization": "localBWAware", under which an allreduce over two dimensions is
  reduce-scatter in the first, allreduce in the second on 1/L of the bytes, all-gather in the first (simfog's
  hierarchical; "baseline" allreduces the whole buffer in each dimension, Sys.cc generate_collective);
  "local-mem-bw" from the reduction bandwidth: ASTRA-sim charges 3 x bytes / local-mem-bw per
  reduced chunk (one write, two reads: PacketBundle.cc, local-mem-bw in 10**9 bytes per second), simfog
  (n-1)/n x M x γ, so local-mem-bw = 3 / γ; without a reduction cost, 10**12 GB/s (well under a nanosecond).
- remote memory: none ("NO_MEMORY_EXPANSION").
"""

from __future__ import annotations

from dataclasses import dataclass

from simfog.cluster import Cluster, Link
from simfog.errors import ConfigError

COLLECTIVES = ("ring", "hierarchical")  # simfog collectives with an ASTRA-sim equivalent on the analytical backend
GIB = float(2**30)
FREE_REDUCTION_GBPS = 1e12


@dataclass(frozen=True)
class Dimension:
    npus: int
    bandwidth_Bps: float
    latency_s: float


@dataclass(frozen=True)
class AstraConfig:
    """ASTRA-sim's inputs for one experiment: the network's dimensions, the reduction bandwidth (B/s, None: free),
    and `notes`: where the configuration only approximates simfog's model."""

    dimensions: tuple[Dimension, ...]
    reduce_Bps: float | None
    notes: tuple[str, ...] = ()

    def network_yaml(self) -> str:
        dims = self.dimensions
        return (f"# simfog export chakra: ASTRA-sim analytical network ({' x '.join(str(d.npus) for d in dims)} NPUs)\n"
                f"topology: [ {', '.join('Ring' for _ in dims)} ]\n"
                f"npus_count: [ {', '.join(str(d.npus) for d in dims)} ]\n"
                f"bandwidth: [ {', '.join(repr(d.bandwidth_Bps / GIB) for d in dims)} ]  # GB/s (2**30 B/s)\n"
                f"latency: [ {', '.join(repr(d.latency_s * 1e9) for d in dims)} ]  # ns\n")

    def system(self) -> dict:
        ring = ["ring"] * len(self.dimensions)
        local = FREE_REDUCTION_GBPS if self.reduce_Bps is None else 3 * self.reduce_Bps / 1e9
        return {"scheduling-policy": "FIFO", "endpoint-delay": 1, "active-chunks-per-dimension": 1,
                "preferred-dataset-splits": 1, "all-reduce-implementation": ring, "all-gather-implementation": ring,
                "reduce-scatter-implementation": ring, "all-to-all-implementation": ring,
                "collective-optimization": "localBWAware", "local-mem-bw": local, "boost-mode": 0}

    @staticmethod
    def memory() -> dict:
        return {"memory-type": "NO_MEMORY_EXPANSION"}


def _link_bps(link: Link) -> float:
    """What one flow reaches on `link` (its flow cap where it has one): the bandwidth of simfog's ring steps."""
    return link.flow_Bps


def config(cluster: Cluster, collective: str, *, source: str | None = None) -> AstraConfig:
    """ASTRA-sim's network and system for `collective` on `cluster` (see the module docstring). Raises
    ConfigError (comm.collective) for a collective without an ASTRA-sim equivalent here."""
    if collective not in COLLECTIVES:
        raise ConfigError("comm.collective", collective, f"one of {', '.join(COLLECTIVES)} to export for ASTRA-sim "
                          "(the collectives its analytical backend runs as simfog costs them)", source=source)
    notes = []
    if cluster.degraded_nics:
        notes.append("degraded NICs are not exported: ASTRA-sim's dimensions have one bandwidth each")
    intra, inter, L, m = cluster.intra, cluster.inter, cluster.ranks_per_node, cluster.nodes
    if collective == "hierarchical" and m > 1 and L > 1:
        shared = min(inter.bandwidth_Bps / L, _link_bps(inter))  # L flows through the NIC, each at most its cap
        dims = (Dimension(L, _link_bps(intra), intra.latency_s), Dimension(m, shared, inter.latency_s))
    else:
        link = intra if m == 1 else inter
        if m > 1 and L > 1 and (intra.latency_s > inter.latency_s or _link_bps(intra) < _link_bps(inter)):
            notes.append("ring: the intra-node link is not faster than the NIC in both latency and bandwidth; the "
                         "exported ring runs every step at the NIC's (simfog: the slower hop of each step)")
        if collective == "hierarchical":
            notes.append("hierarchical on one level (one node, or one rank per node): a single ring")
        dims = (Dimension(cluster.ranks, _link_bps(link), link.latency_s),)
    return AstraConfig(dims, cluster.reduce_Bps, tuple(notes))
