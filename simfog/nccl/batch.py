"""simfog.nccl.choose for many message sizes of one layout at once (numpy over the sizes), for fitting: each
(algorithm, protocol)'s latency and bandwidth are worked out once per layout, then every size's time is
lat · plateau + bytes / (bw · correction) (+ tree fill, launch), NCCL picking by its own view as choose() does.
Equal to choose() to rounding (tests/test_nccl_fit.py holds them together)."""

from __future__ import annotations

import numpy as np

from simfog.nccl import model, p2p
from simfog.nccl.network import NcclNetwork
from simfog.nccl.releases import ALGOS, PROTOS, tables

PAIRS = tuple((a, p) for a in ALGOS for p in PROTOS)


def _log_index(sizes: np.ndarray) -> np.ndarray:
    """NCCL's log2i(nBytes >> 6) per size (-1 below 64 B)."""
    shifted = np.floor(sizes).astype(np.int64) >> 6
    out = np.full(sizes.shape, -1, dtype=np.int64)
    pos = shifted > 0
    out[pos] = np.floor(np.log2(shifted[pos])).astype(np.int64)
    return out


def choose_many(op: str, sizes: np.ndarray, ranks: int, nodes: int, net: NcclNetwork,
                prepared: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, index into PAIRS of NCCL's choice; -1 for alltoall / sendrecv) for every size of `sizes`.
    `prepared`: a dict this function may fill and reuse across calls on the same sizes and layout of networks that
    differ only in fitted parameters (which pairs are allowed and their size corrections)."""
    sizes = np.asarray(sizes, dtype=float)
    if ranks <= 1:
        return np.zeros(sizes.shape), np.full(sizes.shape, -1)
    if op in p2p.OPS:  # p2p.time_s is affine in the size: two evaluations give it
        t0 = p2p.time_s(op, 0.0, ranks, nodes, net)
        slope = (p2p.time_s(op, 2.0**30, ranks, nodes, net) - t0) / 2.0**30
        return t0 + slope * sizes, np.full(sizes.shape, -1)
    t = tables(net.version)
    key = (net.channels, net.two_node_tree_gain > 1.0)
    cache = prepared.get(key) if prepared is not None else None
    if cache is None:
        k = _log_index(sizes)
        pairs = [i for i, (a, p) in enumerate(PAIRS) if model.allowed(op, a, p, ranks, nodes, net, t)]
        cache = (pairs, [_correction(op, *PAIRS[i], k, net, t) for i in pairs])
        if prepared is not None:
            prepared[key] = cache
    pairs, corrections = cache
    views = np.empty((len(pairs), len(sizes)))
    delivered = np.empty((len(pairs), len(sizes)))
    kept = []
    for row, (i, corr) in enumerate(zip(pairs, corrections, strict=True)):
        algo, proto = PAIRS[i]
        bw_view = model.bandwidth_GBps(op, algo, proto, ranks, nodes, net, t, nccl_view=True)
        bw = model.bandwidth_GBps(op, algo, proto, ranks, nodes, net, t) if nodes > 1 else bw_view
        if not (bw_view > 0 and bw > 0):
            views[row] = np.inf
            delivered[row] = np.nan
            continue
        lat = model.latency_us(op, algo, proto, ranks, nodes, net, t)
        lat_view = model.latency_us(op, algo, proto, ranks, nodes, net, t, nccl_view=True) if nodes > 1 else lat
        plat = _plateau(op, algo, proto, sizes, ranks, nodes, net, t)
        views[row] = lat_view * plat + sizes / (1000.0 * bw_view * corr)
        real = (lat * plat + sizes / (1000.0 * bw * corr * _launched(algo, proto, sizes, ranks, nodes, net, t))) * 1e-6
        if algo == "tree" and nodes > 1 and net.tree_fill_B > 0:
            fill = net.tree_fill_B
            # at the uncorrected rate: simfog.nccl.model's docstring says why
            real = real + 2 * np.log2(nodes) * (sizes * fill / (sizes + fill)) / (bw * 1e9)
        delivered[row] = real + net.launch_s
        kept.append(row)
    if not kept:
        return np.full(sizes.shape, np.nan), np.full(sizes.shape, -1)
    pick = np.argmin(views, axis=0)
    return delivered[pick, np.arange(len(sizes))], np.array(pairs)[pick]


def _correction(op, algo, proto, k, net, t) -> np.ndarray:
    rows = t.tree_correction[PROTOS.index(proto)]
    blackwell_nvls_tree = algo == "nvls_tree" and net.gpu_arch == "blackwell" and len(rows) == 24
    if op == "allreduce" and (algo == "tree" or blackwell_nvls_tree):
        limit = 23 if algo == "tree" else 24
        table = np.array(rows[:limit])
        ok = (k >= 0) & (k < limit)
        return np.where(ok, table[np.clip(k, 0, limit - 1)], 1.0)
    return np.ones(k.shape)


def _launched(algo, proto, sizes, ranks, nodes, net, t):
    cut = model.channel_cut(algo, proto, ranks, nodes, net, t)
    if cut is None:
        return 1.0
    n, per_channel = cut
    return np.clip(np.floor(sizes) // per_channel, 1, n) / n


def _plateau(op, algo, proto, sizes, ranks, nodes, net, t) -> np.ndarray:
    if not (algo == "ring" and proto == "Simple" and nodes > 1 and op == "allreduce"):
        return 1.0
    if t.plateau_per_channel:
        hit = np.floor(sizes) // (model.runtime_channels(net, ranks, nodes, t) * ranks) >= 64
    else:
        hit = sizes >= ranks / 16.0 * 65536
    return np.where(hit, t.plateau_factor[net.gpu_arch], 1.0)
