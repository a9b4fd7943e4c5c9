"""The settings of decentralized averaging (BlueFog, BAGUA, win_put; the mixing report): one frozen dataclass whose
__post_init__ is the one place its values are checked."""

from __future__ import annotations

from dataclasses import dataclass

from simfog.algorithms import checks
from simfog.errors import ConfigError

COMBINES = ("awc", "atc")
P2P_SHARING = ("fluid", "together")


@dataclass(frozen=True, kw_only=True)
class DataflowSettings:
    """Who averages with whom and how point-to-point messages share links (None: the algorithm's own default)."""

    topology: str | None = None
    """The communication graph: a name in simfog.topology.TOPOLOGIES."""
    combine: str = "awc"
    """Neighbor averaging: "awc" adapt-with-combine, "atc" adapt-then-combine."""
    negotiate: bool | None = None
    """BlueFog: operations wait for every rank's request (default true; win_put false)."""
    buffered_sends: bool = False
    """A send completes once the socket holds it (TCP, gloo), not when delivered (MPI's rendezvous, NCCL)."""
    p2p_sharing: str = "together"
    """Messages of a step share links as if all started together, or as they overlap in time ("fluid")."""
    hierarchical: bool | None = None
    """BAGUA decentralized / low-precision / bytegrad: average within nodes first (default true)."""
    consensus_eps: float | None = None
    """Mixing report: the consensus error to reach, in (0, 1), relative to the initial disagreement (None: 0.01)."""

    def __post_init__(self):
        self.check_dataflow()

    def check_dataflow(self) -> None:
        """Raise ConfigError (naming the [comm] key) unless every field holds what its docstring allows."""
        from simfog.topology import TOPOLOGIES

        checks.choice(self.topology, "comm.topology", TOPOLOGIES.names())
        checks.choice(self.combine, "comm.combine", COMBINES)
        checks.choice(self.p2p_sharing, "comm.p2p_sharing", P2P_SHARING)
        for key in ("negotiate", "buffered_sends", "hierarchical"):
            checks.flag(getattr(self, key), f"comm.{key}")
        eps = self.consensus_eps
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1):
            raise ConfigError("comm.consensus_eps", eps, "a number in (0, 1): the consensus error to reach, relative "
                              "to the initial disagreement")
