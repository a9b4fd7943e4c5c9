"""The validator's calibration for runs on GPUs: simfog's NCCL model (simfog.nccl) fitted to the run's own NCCL
microbenchmarks, as `simfog calibrate` fits nccl-tests logs (simfog.nccl_fit), and applied to the experiment the
simulator runs (collective "nccl", the fitted network as if given by `[cluster] network`).

The NCCL release picks the model's constant tables: the microbenchmarks record torch's NCCL version; releases
before 2.19 use the 2.8 tables (2.19 changed the ring LL bandwidth factor and added the per-step net overhead),
later ones the 2.30 tables. The GPU generation comes from the recorded GPU name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simfog import nccl_fit
from simfog.cluster import Cluster, Link
from simfog.experiment import Experiment
from simfog.network_file import NetworkFile
from simfog.trace import NetworkTrace


def tables_for(version: str | None) -> str:
    """simfog.nccl.VERSIONS entry for an NCCL release string such as "2.21.5" (None or unreadable: "2.30")."""
    try:
        major, minor = (int(x) for x in str(version).split(".")[:2])
    except ValueError:
        return "2.30"
    return "2.8" if (major, minor) < (2, 19) else "2.30"


@dataclass(frozen=True)
class NcclFit:
    """A fitted NCCL network with its residuals; what validate.run keeps as a group's calibration."""

    calibration: nccl_fit.NcclCalibration
    fits: dict = field(default_factory=dict)  # no link classes (validate.comparison.report lists those of a gloo fit)

    @property
    def network(self):
        return self.calibration.network

    @property
    def residuals(self):
        """One row per microbenchmark, in the columns of simfog.calibrate.Calibration.residuals that the report
        reads (link_class "nccl")."""
        import pandas as pd

        return pd.DataFrame([{"link_class": "nccl", "collective": p.op, "ranks": p.ranks, "nodes": p.nodes,
                              "bytes": p.bytes, "measured_s": p.measured_s, "predicted_s": p.predicted_s,
                              "rel_error": p.rel_error} for p in self.calibration.points])

    def report(self) -> str:
        return self.calibration.report()

    def apply(self, cluster: Cluster) -> Cluster:
        """`cluster` with links that stand for the fitted bus bandwidths, as an experiment's network file sets them
        (simfog.experiment: intra = one node's bus bandwidth, NIC = several nodes' and the inter-node latency)."""
        n = self.network
        return replace(cluster, intra=Link(cluster.intra.latency_s, n.intra_bus_Bps),
                       nic=Link(n.latency_inter_s, n.inter_bus_Bps))

    def simulated(self, exp: Experiment) -> Experiment:
        """`exp` on the fitted network with NCCL's model as its collective."""
        network = NetworkFile(self.network, {"source": "validate.run NCCL microbenchmarks on the run's own nodes",
                                             "how": "simfog.nccl_fit of min-of-repeats times"})
        return replace(exp, cluster=self.apply(exp.cluster), network=network,
                       comm=replace(exp.comm, collective="nccl"))


def fit(net: NetworkTrace, collective: str) -> NcclFit:
    """Fit the measurements of `collective` in `net` (the validator's NCCL microbenchmarks). Raises Infeasible
    when they cannot be fitted (simfog.nccl_fit.fit)."""
    software = net.extra.get("software", {}) if isinstance(net.extra, dict) else {}
    only = replace(net, measurements=tuple(m for m in net.measurements if m.collective == collective))
    return NcclFit(nccl_fit.fit([only], version=tables_for(software.get("nccl")),
                                source="validate.run NCCL microbenchmarks"))
