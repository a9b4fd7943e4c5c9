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

from dataclasses import replace

from simfog.experiment import Comm, Experiment
from validate.families.decentralized import Decentralized


class Wagma(Decentralized):
    algorithm = "wagma"

    def simulated_comm(self, comm: Comm) -> Comm:
        # the real run: blocking subgroup allreduces and a global one, gloo rings
        return replace(comm, wait_for_group=True, global_collective=True, group_collective=True)

    def row_keys(self, exp: Experiment) -> dict:
        from validate.ranks.decentralized import WAGMA_NOTE

        return {"merge": "", "note": WAGMA_NOTE}
