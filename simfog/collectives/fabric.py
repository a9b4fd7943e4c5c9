"""A collective's cost on a shared fabric: the fabric folded into the inter-node link the closed forms read.

A cluster with a non-flat fabric (Cluster.fabric, simfog.fabric.job.JobFabric) costs each collective by its
α-β(-γ) form as everywhere else, on an inter-node link whose β is the fabric's slowdown of the collective's step
pattern times the NIC's (the slowest flow of each step, routed and shared max-min in closed form) and whose α adds
the switches the step's longest route crosses (simfog.fabric.job.inter_slowdown). The event engine and every
closed form ask the same CostModel, so they stay equal; a cluster without a fabric never comes here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from simfog.cluster import Group


@lru_cache(maxsize=1 << 10)
def on_fabric(model, op: str, group: Group):
    """`model` (a collectives.CostModel whose cluster has a fabric) for `op` among `group`: its cluster's NIC
    slowed and delayed as the fabric makes it (module docstring), the fabric then dropped; a calibrated NCCL
    network's inter-node bus bandwidth and latency alike. Raises Infeasible for a collective without a step
    pattern on a fabric."""
    from simfog.fabric.job import inter_slowdown  # here: a run without a fabric never loads simfog.fabric

    c = model.cluster
    slow = inter_slowdown(c.fabric, model.algorithm, op, c.nodes, group.nodes, group.per_node)
    nic = replace(c.nic, latency_s=c.nic.latency_s + slow.extra_latency_s,
                  bandwidth_Bps=c.nic.bandwidth_Bps / slow.factor)
    nccl = model.nccl
    if nccl is not None:
        nccl = replace(nccl, inter_bus_Bps=nccl.inter_bus_Bps / slow.factor,
                       latency_inter_s=nccl.latency_inter_s + slow.extra_latency_s)
    return replace(model, cluster=replace(c, nic=nic, fabric=None), nccl=nccl)
