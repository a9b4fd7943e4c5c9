"""How well the models of an averaging algorithm agree: the mixing report of simfog.results (decentralized, group
and asynchronous averaging)."""

from __future__ import annotations

from simfog.topology import Topology

DEFAULT_CONSENSUS_EPS = 0.01           # simfog's choice: 1 % of the initial disagreement


def mixing_of(topo: Topology | None, eps: float, name: str | None = None) -> dict:
    """Mixing report of a topology averaged once per iteration (see simfog.topology: spectral gap over one
    period, iterations to reach consensus error eps); topo None means an exact average every iteration."""
    if topo is None:
        return {"topology": name or "full", "spectral_gap": 1.0, "iterations_to_consensus": 1, "consensus_eps": eps,
                "averaging_rounds_per_iteration": 1.0}
    return {"topology": name or topo.name, "spectral_gap": topo.spectral_gap(),
            "iterations_to_consensus": topo.iterations_to_consensus(eps), "consensus_eps": eps,
            "averaging_rounds_per_iteration": 1.0}
