"""The algorithm families validate runs, one adapter per algorithm behind validate.families.base.Family: what to
check, what to calibrate, what to launch and how to compare. validate.run looks an experiment's adapter up here
(`family_of`) and calls its hooks.

- validate.families.allreduce: "allreduce" (every merge policy; torch DDP for "ddp");
- validate.families.sharded: "fsdp" (FSDP2 itself), "zero2" (DeepSpeed stage 2's schedule);
- validate.families.decentralized: "neighbor" (BlueFog-style neighbour averaging);
- validate.families.wagma: "wagma" (group averaging, run as blocking gloo group allreduces).
"""

from __future__ import annotations

from simfog.errors import ConfigError
from validate.families.allreduce import Allreduce
from validate.families.base import Family
from validate.families.decentralized import Neighbor
from validate.families.sharded import Fsdp, Zero2
from validate.families.wagma import Wagma

#: algorithm -> its adapter, in the order messages list them
FAMILIES: dict[str, Family] = {f.algorithm: f for f in (Allreduce(), Neighbor(), Wagma(), Fsdp(), Zero2())}


def family_of(exp) -> Family:
    """The adapter of `exp`'s comm.algorithm; ConfigError for an algorithm validate does not run."""
    algorithm = exp.comm.algorithm
    if algorithm not in FAMILIES:
        raise ConfigError("comm.algorithm", algorithm, f"one of {', '.join(FAMILIES)} (the algorithms validate runs)",
                          source=exp.source)
    return FAMILIES[algorithm]
