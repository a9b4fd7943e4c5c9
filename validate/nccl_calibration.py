"""The validator's calibration for runs on GPUs: simfog's NCCL model (simfog.nccl) fitted to the run's own NCCL
microbenchmarks, as `simfog calibrate` fits nccl-tests logs (simfog.nccl.fit), and applied to the experiment the
simulator runs (collective "nccl", the fitted network as if given by `[cluster] network`).

The NCCL release picks the model's constant tables: the microbenchmarks record torch's NCCL version, and
simfog.nccl has the tables of every release from 2.8. The GPU generation comes from the recorded GPU name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simfog.cluster import Cluster, Link
from simfog.experiment import Experiment
from simfog.nccl import fit as nccl_fit
from simfog.network_file import NetworkFile
from simfog.trace import NetworkTrace


def tables_for(version: str | None) -> str:
    """The NCCL release whose tables simfog.nccl uses for the release string the microbenchmarks recorded, such as
    "2.21.5" (every release from 2.8 has its own; None, unreadable or older than 2.8: "2.30")."""
    from simfog.errors import ConfigError
    from simfog.nccl import parse_release

    try:
        parse_release(str(version))
    except ConfigError:
        return "2.30"
    return str(version)


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
                                             "how": "simfog.nccl.fit of min-of-repeats times"})
        return replace(exp, cluster=self.apply(exp.cluster), network=network,
                       comm=replace(exp.comm, collective="nccl"))


def fit(net: NetworkTrace, collective: str) -> NcclFit:
    """Fit the measurements of `collective` in `net` (the validator's NCCL microbenchmarks). Raises Infeasible
    when they cannot be fitted (simfog.nccl.fit.fit)."""
    software = net.extra.get("software", {}) if isinstance(net.extra, dict) else {}
    only = replace(net, measurements=tuple(m for m in net.measurements if m.collective == collective))
    return NcclFit(nccl_fit.fit([only], version=tables_for(software.get("nccl")),
                                source="validate.run NCCL microbenchmarks"))
