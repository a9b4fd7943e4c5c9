"""WAGMA group model averaging, replay mode: validate.ranks.decentralized's GroupAverage with the simulator's own
groups, every global_every-th iteration a global average.

It is run as a blocking group allreduce, which waits for the group's members where simfog's model (and real WAGMA)
does not: the two agree only without stragglers, so heterogeneity is refused for it (validate.ranks.decentralized).
The simulated side is set to what gloo runs: comm.wait_for_group (the group's operation starts with its last
member), comm.group_collective (each group operation a ring among its members, through simfog.p2p) and
comm.global_collective (the global step gloo's ring over all ranks). Links from the sendrecv fit, as neighbour
averaging's (validate.families.decentralized).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from simfog.experiment import Comm, Experiment
from validate.families.base import fit_of
from validate.families.decentralized import Decentralized
from validate.host_calibration import overheads_record, with_overheads


class Wagma(Decentralized):
    algorithm = "wagma"

    def simulated_comm(self, comm: Comm) -> Comm:
        # the real run: blocking subgroup allreduces and a global one, gloo rings
        return replace(comm, wait_for_group=True, global_collective=True, group_collective=True)

    def with_host_costs(self, sim_exp: Experiment, fits: Mapping) -> tuple[Experiment, object, str]:
        """The fit at the model's size as collective_overhead_s, which simfog's wagma adds to every group and
        global operation (one message of the model's bytes each)."""
        fit, why = fit_of(fits, self.algorithm)
        if fit is None:
            return sim_exp, None, why
        nbytes = float(sim_exp.workload.trace.nbytes)
        record = overheads_record(sim_exp)
        record["collective_overhead_s"] = value = fit.excess_s(nbytes)
        record["collective_overhead_s_how"] = f"{fit.how}; at the model's {nbytes / 1e3:.4g} kB"
        note = (f"{fit.how}; applied as collective_overhead {value * 1e3:.3f} ms per group and global operation "
                f"(at the model's {nbytes / 1e3:.4g} kB)")
        return with_overheads(sim_exp, record), fit, note

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.decentralized import WAGMA_NOTE

        return {"merge": "", "note": WAGMA_NOTE}
