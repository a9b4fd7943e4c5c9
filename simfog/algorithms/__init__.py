"""Training algorithms: what each rank communicates, when, and with whom.

An algorithm is a class registered here, built with the Simulation, with:
- `symmetric` (class attribute): True when it treats all ranks alike (the engine may then simulate one rank);
- `backward_started(rank, iteration, sample, t_backward) -> simpy.Event | None`: called when a rank starts
  backward; returns the event the rank's optimizer step must wait for (None: nothing to wait for);
- `describe_buckets() -> list[dict]`: what is sent per iteration (for the Result);
- optionally `run_iteration(rank, iteration, sample, slow, delay)`: a SimPy generator running one whole iteration
  (records its own intervals; sharded algorithms, whose communication gates compute), and `memory() -> Memory`.
"""

from simfog.algorithms import (  # each module registers its entries
    allreduce,  # noqa: F401
    asynchronous,  # noqa: F401
    compressed,  # noqa: F401
    decentralized,  # noqa: F401
    sharded_plans,  # noqa: F401  (fsdp, hsdp, zero1-3 on simfog.algorithms.sharded's machinery)
    wagma,  # noqa: F401
)
from simfog.algorithms.registry import REGISTRY

__all__ = ["REGISTRY"]
