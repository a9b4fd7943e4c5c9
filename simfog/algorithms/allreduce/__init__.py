"""Static-bucket allreduce, plain and compressed: gradients merged into buckets (simfog.merge) and allreduced among
all ranks, overlapping backward (DDP, BAGUA, MG-WFBP...; fp16, PowerSGD, ByteGrad and QAdam on compressed bytes).

Buckets are fixed before the run by a static merge policy and launched strictly in order on each rank's
communication stream (or on up to comm.streams at once, sharing the links). Horovod's fusion happens at run time
instead (merge = "horovod"): simfog.algorithms.dynamic runs it.

Costs beyond the wire (simfog.overheads, `Experiment.overheads()`): each bucket (fused buffer) of M bytes pays
M/bucket_copy_Bps to pack before its collective, collective_overhead_s to launch it, and M/bucket_copy_Bps to unpack
after it, all on the rank's communication stream (recorded as "comm" intervals named `<bucket>.pack`,
`<bucket>.overhead`, `<bucket>.unpack`). The overlap slowdown is approximated: backward runs overlap_slowdown
times slower from the moment the first bucket is launched (Horovod: the first gradient is ready) to its end,
whether or not a collective is still running then; gradient-ready times after that moment stretch alike. This
over-estimates the slowdown where the collectives finish well before backward does.

plan.py: the buckets and their ready times; program.py: the event engine's program; closed_form.py: its max-plus
closed form on one stream, closed_form_streams.py on several; compressed.py: the compressed variants' bucket costs.
"""

from simfog.algorithms.allreduce.compressed import ByteGrad, Fp16Allreduce, PowerSGD, QAdam
from simfog.algorithms.allreduce.program import AllreduceSGD
from simfog.algorithms.registry import REGISTRY

REGISTRY.register("allreduce")(AllreduceSGD)
REGISTRY.register("fp16")(Fp16Allreduce)
REGISTRY.register("bytegrad")(ByteGrad)
REGISTRY.register("qadam")(QAdam)
REGISTRY.register("powersgd")(PowerSGD)
