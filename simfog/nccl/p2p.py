"""alltoall and send/recv: NCCL runs them as grouped point-to-point operations through its p2p transports (P2P or
SHM inside a node, the NET transport between nodes), not through tuning.cc's algorithm table, so simfog models them
from the transport's rate and a latency per peer (simfog's model, not NCCL's):

    sendrecv (nccl-tests: rank r sends S to r+1, receives S from r-1): t = p2p latency + S / rate, the rate of a
        GPU's NVLink on one node, of one NIC on several (each node has one pair leaving it);
    alltoall (nccl-tests: each rank sends S/n to every rank): t = (n-1) · p2p latency + max(intra, inter), with
        intra = S·(G-1)/n / GPU rate (a GPU pushes its node-mates' shares over its NVLink) and
        inter = G·S·(n-G)/n / (NIC rate · NICs used) (the node's NICs carry all its GPUs' remote shares, rails);

plus net.launch_s, G GPUs per node; sendrecv's NIC rate times what the network's fabric leaves of it at that node count
(simfog.nccl.scale_out; alltoall's many flows spread over the uplinks: none). The rates and latency are the network's
p2p_* fields (fitted from alltoall / sendrecv logs); where None they are derived (`rates`): a GPU's rate = one node's
bus bandwidth, a NIC's = the whole node's inter-node bus bandwidth / NICs, the latency = the release's hwLat of a
Ring/Simple step (NET on several nodes, NVLink or PCI on one).
"""

from __future__ import annotations

from simfog.nccl.model import layout
from simfog.nccl.network import NcclNetwork
from simfog.nccl.releases import tables
from simfog.nccl.scale_out import rate_factor

OPS = ("alltoall", "sendrecv")


def rates(net: NcclNetwork, nodes: int) -> tuple[float, float, float]:
    """(latency per peer s, GPU rate B/s, one NIC's rate B/s), given or derived (module docstring)."""
    t = tables(net.version)
    hw = "net" if nodes > 1 else ("nvlink" if net.nvlink else "pci")
    lat = net.p2p_latency_s if net.p2p_latency_s is not None else t.hw_lat[hw]["ring"][2] * 1e-6
    gpu = net.p2p_intra_Bps if net.p2p_intra_Bps is not None else net.intra_bus_Bps
    nic = net.p2p_nic_Bps if net.p2p_nic_Bps is not None else net.inter_bus_Bps / (net.nics_per_node or 1)
    return lat, gpu, nic


def time_s(op: str, nbytes: float, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """Seconds for one alltoall or sendrecv of nccl-tests' size `nbytes` (module docstring); 0 for one rank."""
    if ranks <= 1:
        return 0.0
    lat, gpu, nic = rates(net, nodes)
    g = layout(ranks, nodes)[2]
    if op == "sendrecv":
        nic *= rate_factor(net.fabric, "sendrecv", nodes, g, net.nics_per_node or 1)  # simfog.nccl.scale_out
        return lat + nbytes / (nic if nodes > 1 else gpu) + net.launch_s
    intra = nbytes * (g - 1) / ranks / gpu
    inter = g * nbytes * (ranks - g) / ranks / (nic * (net.nics_used(g) or 1)) if nodes > 1 else 0.0
    return (ranks - 1) * lat + max(intra, inter) + net.launch_s
