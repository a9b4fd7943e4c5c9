"""The result of an NCCL calibration (simfog.nccl.fit): the fitted network, every measurement's residual, what was
fitted, assumed and given, the warnings, what the logs covered, and the report printed for people."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simfog import nccl, units
from simfog.nccl.calibrated import Calibrated, FitQuality

FLAG_ERROR = 0.25   # "off": the model misses the point by more than this
FLAG_SLOWER = 1.2   # "non-monotone": the point took this many times longer than the next larger size of its log


@dataclass(frozen=True)
class Point:
    """One measurement against the fitted model (SI units)."""

    op: str
    ranks: int
    nodes: int
    bytes: int
    measured_s: float
    predicted_s: float
    algorithm: str
    protocol: str
    flag: str = ""

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class NcclCalibration:
    """The fitted network and every measurement's residual; `fitted` the parameters the data determined,
    `assumed` what took the hardware's or a default value, `given` the facts from the logs or the user."""

    network: nccl.NcclNetwork
    points: tuple[Point, ...]
    fitted: tuple[str, ...]
    source: str = ""
    assumed: tuple[str, ...] = ()
    given: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    calibrated: Calibrated | None = field(default=None)

    def errors(self, *, flagged: bool = True) -> np.ndarray:
        """|relative error| of every point (without flagged ones when `flagged` is False)."""
        return np.array([abs(p.rel_error) for p in self.points if flagged or not p.flag])

    def report(self) -> str:
        """Parameters, what was fitted / assumed / given, per-size residuals, flagged points, median and worst."""
        n = self.network
        lat = ", ".join(f"{p} {x * 1e6:.3g} us" for p, x in zip(nccl.PROTOS, n.net_latency_s, strict=True) if x)
        nics = (f"{n.nics_per_node} NICs per node" + (f" x {n.nic_Bps * 8 / 1e9:g} Gbit/s" if n.nic_Bps else "")
                if n.nics_per_node else "NICs per node unknown (no rails)")
        channels = n.channels if n.channels is not None else f"from the hardware ({n.graph_channels(64, 2)} per node)"
        out = [f"NCCL model {n.version} ({n.gpu_arch}, {n.cpu_vendor} CPUs, {n.intra_transport} inside a node, "
               f"{nics}, GPU-NIC {n.gpu_nic_path}){' from ' + self.source if self.source else ''}",
               f"  channels {channels}; bus bandwidth one node {n.intra_bus_Bps / 1e9:.4g} GB/s, between nodes "
               f"{n.inter_bus_Bps / 1e9:.4g} GB/s; latencyInter {n.latency_inter_s * 1e6:.3g} us; launch "
               f"{n.launch_s * 1e6:.3g} us; tree fill {units.format_bytes(n.tree_fill_B)}; 2-node tree gain "
               f"{n.two_node_tree_gain:.3g}" + (f"; extra inter-node latency {lat}" if lat else ""),
               f"  fitted: {', '.join(self.fitted)}"]
        if self.given:
            out.append(f"  given: {'; '.join(self.given)}")
        if self.assumed:
            out.append(f"  assumed: {'; '.join(self.assumed)}")
        out += [f"  warning: {w}" for w in self.warnings]
        out += ["", f"{'op':14s} {'ranks':>5s} {'nodes':>5s} {'size':>10s} {'measured':>10s} {'predicted':>10s} "
                    f"{'error':>7s}  {'choice':16s} flag"]
        for p in self.points:
            out.append(f"{p.op:14s} {p.ranks:5d} {p.nodes:5d} {units.format_bytes(p.bytes):>10s} "
                       f"{units.format_time(p.measured_s):>10s} {units.format_time(p.predicted_s):>10s} "
                       f"{p.rel_error:+7.1%}  {p.algorithm + '/' + p.protocol:16s} {p.flag}")
        e, ok = self.errors(), self.errors(flagged=False)
        flagged = sum(1 for p in self.points if p.flag)
        out += ["", f"{len(e)} points: median |error| {np.median(e):.1%}, worst {e.max():.1%}; "
                    f"{flagged} flagged" + (f" (without them: median {np.median(ok):.1%}, worst {ok.max():.1%})"
                                            if flagged and len(ok) else "")]
        quality = self.quality()
        if quality.poor:
            out.append(f"POOR FIT: rms log error {quality.rms_log_error:.2f}; check the flagged points and the facts "
                       "(--nccl-version, --gpu-arch, --nics-per-node, ...) before using this network (the network "
                       "file records it, and every prediction from it says so)")
        return "\n".join(out)

    def quality(self) -> FitQuality:
        """How well the model fits these points: what the network file keeps, and every row using it shows."""
        return FitQuality.of((p.rel_error for p in self.points), (p.flag for p in self.points))

    def to_dict(self) -> dict:
        """JSON-ready: the network (SI), what was fitted / assumed / given, warnings and every point."""
        n = self.network
        return {"model": "nccl", "network": {k: getattr(n, k) for k in n.__dataclass_fields__},
                "fitted": list(self.fitted), "assumed": list(self.assumed), "given": list(self.given),
                "warnings": list(self.warnings),
                "calibrated": ({k: [None if x != x else x for x in v] if k.startswith(("interval_", "inside_")) and
                                isinstance(v, list) else v for k, v in self.calibrated.to_toml().items()}
                               if self.calibrated else None),  # JSON has no nan: too few points is null
                "points": [{"op": p.op, "ranks": p.ranks, "nodes": p.nodes, "bytes": p.bytes,
                            "measured_s": p.measured_s, "predicted_s": p.predicted_s, "rel_error": p.rel_error,
                            "algorithm": p.algorithm, "protocol": p.protocol, "flag": p.flag} for p in self.points]}


def residual_points(pts, net: nccl.NcclNetwork, thread_launch_s: float = 0.0) -> tuple[Point, ...]:
    """Every measurement (op, ranks, nodes, bytes, seconds, GPUs per thread) against `net`, with its flag ("off",
    "non-monotone": a disturbed run, no model of a collective gives that), sorted by (op, ranks, nodes, bytes)."""
    pts = sorted(pts, key=lambda p: p[:4])
    out = []
    for i, (op, r, n, b, t, g) in enumerate(pts):
        c = nccl.choose(op, b, r, n, net)
        predicted = c.time_s + (g - 1) * thread_launch_s
        nxt = pts[i + 1] if i + 1 < len(pts) and pts[i + 1][:3] == (op, r, n) else None
        flag = "non-monotone" if nxt is not None and t > FLAG_SLOWER * nxt[4] else (
            "off" if abs(predicted - t) / t > FLAG_ERROR else "")
        out.append(Point(op, r, n, b, t, predicted, c.algorithm, c.protocol, flag))
    return tuple(out)
