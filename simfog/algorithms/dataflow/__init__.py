"""Decentralized averaging as dataflow: BlueFog neighbour averaging and win_put, BAGUA decentralized SGD.

Each rank combines its parameters with its neighbours' (simfog.topology); nothing is averaged globally. One
iteration's communication is a `Plan` (plan.py): a dataflow graph evaluated in max-plus algebra, where every
operation (a point-to-point message, an intra-node collective, an encode) starts once all its inputs have ended and
lasts a fixed time, and a rank's optimizer step waits for the rank's last operation. A message starts when its
sender has launched it and its receiver is ready, i.e. has launched its own exchange (receives are posted with the
sends: MPI Isend/Irecv + Waitall in BlueFog's MPI controller, one NCCL group in BlueFog's NCCL controller and in
BAGUA); a rank's exchange completes when all its sends and receives have. Message durations are, by default
("together"), what they would be if every rank exchanged at the same moment (simfog.p2p.message_times over all
messages of the step, once per phase; exact when ranks run in step), or, with comm.p2p_sharing = "fluid", what the
links give as messages of any step overlap in time (fluid.py, in time order: ranks that drift apart take turns).
Intra-node steps of hierarchical variants are costed by the CostModel of comm.collective among the node's ranks.

Ranks are never assumed identical here (`symmetric = False`): placement makes some messages intra-node. The Plan
is fixed before the run, so the closed form (closed_form.py) evaluates it over every rank at once (numpy), the
event engine's times bit for bit; the event engine (program.py) runs it only when asked (path = "events"), and
not under "fluid", where a message's duration depends on messages that start after it. Launch points and sources
of each algorithm: bluefog.py, bagua.py.
"""

from simfog.algorithms.dataflow.bagua import BaguaDecentralized, BaguaLowPrecisionDecentralized
from simfog.algorithms.dataflow.bluefog import HierarchicalNeighborAveraging, NeighborAveraging, WinPut
from simfog.algorithms.registry import REGISTRY

REGISTRY.register("neighbor")(NeighborAveraging)
REGISTRY.register("hierarchical_neighbor")(HierarchicalNeighborAveraging)
REGISTRY.register("decentralized")(BaguaDecentralized)
REGISTRY.register("low_precision_decentralized")(BaguaLowPrecisionDecentralized)
REGISTRY.register("win_put")(WinPut)
