"""The static-bucket allreduce family's plan: what is decided before the run. The buckets a static merge policy makes
of the gradients (simfog.merge), when each is ready after backward starts (per trace sample), what one bucket costs
on the communication stream, and a collective's time when several share the links.

The validator runs exactly `static_plan`'s buckets.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simfog import merge
from simfog.overheads import CommOverheads, stretch_after


def merge_settings(comm) -> merge.MergeSettings:
    """The merge policies' settings of `comm` (its threshold and Horovod's cycle time)."""
    return merge.MergeSettings(threshold_bytes=comm.threshold_bytes, cycle_time_s=comm.cycle_time_s)


def tensor_ready_offsets(sim) -> tuple[list, np.ndarray]:
    """The gradient tensors in ready order and, per trace sample, when each is ready after backward starts."""
    trace = sim.experiment.workload.trace
    tensors = merge.grad_tensors(trace)
    layer = trace.layer_index()
    cols = np.array([layer[t.name] for t in tensors], dtype=int)
    return tensors, sim.compute.layer_end_s[:, cols]


def static_plan(experiment, cost=None) -> tuple[merge.Bucket, ...]:
    """The buckets the engine launches for `experiment` under a static merge policy (every policy but horovod's
    cycles), in launch order: the policy applied to the trace's gradients in ready order with the cost one bucket
    pays on the communication stream (wire time, launch overhead, both copies). `cost`: the experiment's
    CostModel when already built. The validator runs exactly this plan."""
    comm = experiment.comm
    cost = cost or experiment.cost_model()
    return merge.plan(comm.merge, merge.grad_tensors(experiment.workload.trace), merge_settings(comm),
                      bucket_cost(cost.allreduce, experiment.overheads()))


def bucket_cost(allreduce, oh: CommOverheads):
    """allreduce_time(nbytes) plus the overheads one bucket pays on the communication stream."""
    if not oh.any:
        return allreduce
    return lambda nbytes: allreduce(nbytes) + oh.collective_overhead_s + 2 * oh.copy_s(nbytes)


def bucket_ready(buckets, tensors, offsets: np.ndarray) -> np.ndarray:
    """(samples, buckets): when each bucket is launched after backward starts, per trace sample: when its last
    gradient is ready."""
    index = {t.name: i for i, t in enumerate(tensors)}
    return np.stack([offsets[:, [index[n] for n in b.tensors]].max(1) for b in buckets], axis=1)


def slowed_backward(backward_s: np.ndarray, ready: np.ndarray, first: np.ndarray, factor: float):
    """Backward stretched after `first` (samples, 1) by the overlap slowdown `factor`: (the backward each trace
    sample then takes, `ready` (samples, n), times from backward's start, stretched alike)."""
    return stretch_after(backward_s, first[:, 0], factor), stretch_after(ready, first, factor)


def shared_allreduce_time(cost):
    """duration(nbytes, k): allreduce time when k collectives share every link's bandwidth (latency unshared; a
    link's flow cap, simfog.cluster.Link, still bounds each collective's flow)."""
    models = {}

    def duration(nbytes: float, k: int) -> float:
        if k not in models:
            c = cost.cluster
            cluster = replace(c, intra=c.intra.with_bandwidth(c.intra.bandwidth_Bps / k),
                              nic=c.nic.with_bandwidth(c.nic.bandwidth_Bps / k),
                              degraded_nics=tuple((n, bw / k) for n, bw in c.degraded_nics))
            beta = None if cost.beta_s_per_B is None else cost.beta_s_per_B * k
            models[k] = replace(cost, cluster=cluster, beta_s_per_B=beta)
        return models[k].allreduce(nbytes)

    return duration
