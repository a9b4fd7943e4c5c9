"""Collective cost models: what one allreduce (allgather, reduce-scatter, broadcast, reduce) costs on a cluster.

`core`: the registry of collective algorithms (ALGORITHMS: ring, gloo_ring, rhd, tree, hierarchical, ps, nccl,
linear), the CostModel an experiment uses and point-to-point time. `ompi`: Open MPI's tuned decision (collective
"ompi"), registered on import. Import the names from here.
"""

from simfog.collectives import ompi  # noqa: F401  (registers "ompi" into ALGORITHMS)
from simfog.collectives.core import ALGORITHMS, OPS, CostModel, p2p_time

__all__ = ["ALGORITHMS", "OPS", "CostModel", "p2p_time"]
