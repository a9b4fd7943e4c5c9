"""Training algorithms (comm.algorithm), by family: what each rank communicates, when, and with whom.

Every algorithm implements the protocol of simfog.engine.protocol.TrainingAlgorithm (its docstring lists every
hook an engine may call). A family is one folder whose modules bear the same names in every family:

- `plan.py`: what is decided before the run (buckets, Plans, launch times, costs), pure functions;
- `program.py`: the algorithms' classes and what each rank does on the event engine (their SimPy hooks);
- `closed_form.py`: the same run solved without the event engine, bit for bit (or, where the family decides at
  run time, why it cannot be);
- `__init__.py`: the family's semantics and sources, and the registration of its algorithms by name.

Families: allreduce (static buckets, plain and compressed), sharded (FSDP2, HSDP, ZeRO 1-3), dataflow
(decentralized averaging: BlueFog, BAGUA, win_put), dynamic (decided at run time: Horovod, WAGMA, BAGUA async).
Shared by families: codecs (compression), mixing (how well models agree), sums (the closed forms' sums).
A new family is one folder and one line below (docs/architecture.md; docs/DEVELOPING.md).
"""

from simfog.algorithms import allreduce, dataflow, dynamic, sharded  # noqa: F401  (each registers its algorithms)
from simfog.algorithms.registry import REGISTRY

__all__ = ["REGISTRY"]
