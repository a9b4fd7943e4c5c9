"""What a calibration covered (the layouts, sizes, collectives, NCCL release and GPU model of its logs) and how well
its model fitted them (FitQuality: POOR FIT, flagged points), kept in the network file, and every way a prediction
leaves it: more GPUs or NICs per node than any log, 3+ nodes from logs of at most 2 (NCCL switches every
per-node-count cap between 2 and 3 nodes), more nodes than any log, sizes outside the logs', a collective with no
log, another release than the logs'."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simfog import units
from simfog.bands import HalfWidths
from simfog.errors import Caveat, ConfigError
from simfog.nccl.network import NcclNetwork
from simfog.nccl.releases import NEWEST, parse_release

POOR_FIT_RMS = 0.2  # rms of ln(predicted / measured) over a calibration's points above which its fit is POOR FIT


@dataclass(frozen=True)
class FitQuality:
    """How well a calibration's model fits its own logs: `points` measurements, `flagged` of them flagged (off by
    over 25 % or slower than a larger size: simfog.nccl.report), the rms of ln(predicted / measured) and the
    relative error (predicted / measured - 1) of the worst point, with its sign."""

    points: int
    flagged: int
    rms_log_error: float
    worst_error: float

    @staticmethod
    def of(rel_errors, flags) -> FitQuality:
        """The quality of points with these relative errors (predicted / measured - 1) and flags ("" unflagged)."""
        errors = list(rel_errors)
        rms = math.sqrt(sum(math.log1p(e) ** 2 for e in errors) / len(errors))
        return FitQuality(len(errors), sum(1 for f in flags if f), rms, max(errors, key=abs))

    @property
    def poor(self) -> bool:
        return self.rms_log_error > POOR_FIT_RMS

    def caveats(self) -> list[Caveat]:
        """POOR FIT and FLAGGED, as every prediction on this calibration carries them ([] for a clean fit)."""
        out = []
        if self.poor:
            out.append(Caveat("POOR FIT", f"network fit rms log error {self.rms_log_error:.2f}, worst "
                                          f"{100 * self.worst_error:+.0f} %"))
        if self.flagged:
            out.append(Caveat("FLAGGED", f"{self.flagged} of {self.points} calibration points flagged"))
        return out

    def to_toml(self) -> dict:
        return {"fit_points": self.points, "fit_flagged": self.flagged,
                "fit_rms_log_error": round(self.rms_log_error, 6), "fit_worst_error": round(self.worst_error, 6)}

    @staticmethod
    def from_toml(d: dict) -> FitQuality | None:
        """The fit_* keys of a [calibrated] section (None when absent: a file written before they were). Raises
        ValueError or TypeError for bad values."""
        keys = ("fit_points", "fit_flagged", "fit_rms_log_error", "fit_worst_error")
        if not any(k in d for k in keys):
            return None
        points, flagged = (d[k] for k in keys[:2])
        rms, worst = (float(d[k]) for k in keys[2:])
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (points, flagged)) or not (
                0 <= flagged <= points and rms >= 0 and math.isfinite(rms) and math.isfinite(worst)):
            raise ValueError
        return FitQuality(points, flagged, rms, worst)


@dataclass(frozen=True)
class Calibrated:
    """Coverage of a calibration: release of the logs ("" if unknown), layouts (nodes, GPUs per node), the smallest
    and largest message (B) and the collectives measured."""

    release: str
    layouts: tuple[tuple[int, int], ...]
    min_bytes: int
    max_bytes: int
    collectives: tuple[str, ...]
    # conformal half-widths of the model's error on the logs' own larger scales, each predicted from the smaller
    # ones (simfog.nccl.bands.leave_a_scale_out); None: the logs hold one scale, or not recorded
    intervals: HalfWidths | None = None
    quality: FitQuality | None = None  # how well the model fitted the logs (None: not recorded)
    gpu: str = ""  # the GPU model the logs name ("H100"; "": none or several)
    # the same for a prediction inside the logs' node counts: each middle node count predicted from the logs of
    # every other count (simfog.nccl.bands.leave_a_scale_in); None: fewer than 3 node counts, or not recorded
    inside: HalfWidths | None = None

    def to_toml(self) -> dict:
        return {"release": self.release, "layouts": [f"{n}x{g}" for n, g in self.layouts],
                "sizes": [f"{self.min_bytes}B", f"{self.max_bytes}B"], "collectives": list(self.collectives),
                **({"gpu": self.gpu} if self.gpu else {}),
                **(self.quality.to_toml() if self.quality is not None else {}),
                **(self.intervals.to_toml() if self.intervals is not None else {}),
                **(self.inside.to_toml("inside") if self.inside is not None else {})}

    @staticmethod
    def from_toml(d: object, source: str) -> Calibrated:
        """The [calibrated] section of a network file. Raises ConfigError naming the key."""
        allowed = ('release = "2.21.5", layouts = ["2x8", ...], sizes = ["8B", "8GiB"], collectives = [...], '
                   'gpu = "H100"')
        if not isinstance(d, dict) or {k for k in d if not k.startswith(("interval_", "inside_", "fit_"))} - {
                "release", "layouts", "sizes", "collectives", "gpu"}:
            raise ConfigError("calibrated", d, allowed + ", fit_*, interval_*, inside_* (written by simfog calibrate)",
                              source=source)
        intervals = HalfWidths.from_toml(d, source)
        inside = HalfWidths.from_toml(d, source, "inside")
        try:
            layouts = tuple(tuple(int(x) for x in str(s).split("x")) for s in d.get("layouts", []))
            if any(len(lay) != 2 or min(lay) < 1 for lay in layouts):
                raise ValueError
            sizes = d.get("sizes", ["0B", "0B"])
            lo, hi = (int(units.nbytes(str(s), field="calibrated.sizes")) for s in sizes)
            release = str(d.get("release", ""))
            if release:
                parse_release(release, "calibrated.release")
            colls = tuple(str(c) for c in d.get("collectives", []))
            quality = FitQuality.from_toml(d)
        except (ValueError, TypeError, KeyError, ConfigError):
            raise ConfigError("calibrated", d, allowed + ", fit_points, fit_flagged, fit_rms_log_error, "
                              "fit_worst_error", source=source) from None
        return Calibrated(release, layouts, lo, hi, colls, intervals, quality, str(d.get("gpu", "")), inside)

    def node_counts(self) -> int:
        """How many different node counts the logs hold."""
        return len({n for n, _ in self.layouts})

    def within(self, nodes: int) -> bool:
        """Whether `nodes` lies within the node counts of the logs (from the fewest to the most)."""
        counts = [n for n, _ in self.layouts]
        return bool(counts) and min(counts) <= nodes <= max(counts)

    def distance(self, nodes: int) -> float | None:
        """How far a prediction on `nodes` nodes extrapolates: nodes / the most nodes of the logs (None: no layouts
        recorded). The bench's band widens with it (simfog.nccl.bands.bench_width)."""
        most = max((n for n, _ in self.layouts), default=0)
        return nodes / most if most else None

    def notes(self, net: NcclNetwork, op: str | None, nodes: int, gpus_per_node: int,
              nbytes: float | None = None) -> list[str]:
        """Every way a prediction of `op` (None: any) at `nbytes` (None: not checked) on `nodes` x `gpus_per_node`
        leaves this calibration, as short phrases; [] inside it."""
        out = []
        gpus = max((g for _, g in self.layouts), default=0)
        most_nodes = max((n for n, _ in self.layouts), default=0)
        if gpus_per_node > gpus:
            out.append(f"{gpus_per_node} GPUs per node (logs: at most {gpus})")
        k = net.nics_used(gpus_per_node)
        k_logs = max((net.nics_used(g) or 0 for n, g in self.layouts if n > 1), default=0)
        if k is not None and nodes > 1 and k > k_logs:
            out.append(f"{k} NICs per node in use (logs: at most {k_logs})")
        if nodes > most_nodes:  # the scale-out band widens with nodes / most_nodes (simfog.nccl.bands)
            out.append(f"{nodes} nodes, extrapolated from {most_nodes} nodes"
                       + (" (NCCL's caps change at 3 nodes)" if nodes >= 3 and most_nodes <= 2 else ""))
        if op is not None and self.collectives and op not in self.collectives:
            out.append(f"{op}: no {op} log (calibrated on {', '.join(self.collectives)})")
        if nbytes is not None and self.max_bytes and not self.min_bytes <= nbytes <= self.max_bytes:
            out.append(f"{units.format_bytes(nbytes)} outside the logs' {units.format_bytes(self.min_bytes)}.."
                       f"{units.format_bytes(self.max_bytes)}")
        if self.release and parse_release(self.release) != parse_release(net.version):
            out.append(f"NCCL {net.version} (logs: {self.release})")
        if parse_release(net.version) > NEWEST:
            out.append(f"NCCL {net.version} is newer than simfog's tables ({'.'.join(map(str, NEWEST))})")
        return out


def note_line(notes: list[str]) -> str:
    """'EXTRAPOLATED: a; b' or ''."""
    return f"EXTRAPOLATED: {'; '.join(notes)}" if notes else ""
