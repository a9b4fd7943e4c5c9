"""Algorithms decided at run time: Horovod's fusion cycles, WAGMA's wait-avoiding group averaging, BAGUA's
asynchronous model averaging. None has a schedule fixed before the run (closed_form.py says why), so each runs on
the event engine (program.py); plan.py holds what is known before the run.

- Horovod (comm.algorithm "allreduce" with merge = "horovod"): a background cycle (comm.cycle_time, 1 ms by
  default) negotiates which tensors are ready on every rank, fuses them up to the fusion threshold (comm.threshold,
  128 MiB by default: HOROVOD_FUSION_THRESHOLD) and allreduces the fused buffers one after another, with the
  allreduce family's costs beyond the wire (packs, launch overhead, unpacks) on every rank at once. A cycle that
  took longer than cycle_time is followed at once (Horovod's RunLoopOnce).

- WAGMA-SGD (Li et al., TPDS'21): wait-avoiding group model averaging.

  P ranks (a power of two) average their weights in groups of S every iteration; groups come from recursive doubling
  (docs/ALGORITHMS.md, "WAGMA"): the log2 P bits of a rank id are cut into layouts of log2 S consecutive bits, and at
  iteration k a rank's group is the ranks that differ from it only in the bits of layout k mod (number of layouts), so
  groups are blocks of S consecutive ranks, then stride-S groups, ... and every rank has averaged with all others after
  log_S P iterations. Every `global_every` = τ+1 iterations (τ = 10 in the released code) a global allreduce replaces
  the group one: it is a real synchronization (every rank waits for the last), which bounds staleness by τ.

  A group collective is externally triggered: it starts when the FIRST member launches it; members that arrive later
  do not hold it up (their communication thread contributes their current, stale, weights) and wait only for what is
  left of it, not at all when it has already finished. Whole-model simplification: the paper averages tensor by
  tensor as gradients become ready, overlapping backward; here the whole model is one group operation launched at
  the member's backward start. Costs by recursive doubling, round by round: every rank sends M bytes to its partner
  (rank XOR 2^bit) at once, round times from simfog.p2p.exchange_times (intra-node partners use the intra link; the
  L ranks of a node crossing its NIC share it), the group's time is the sum over its rounds of its slowest message:
  log2(S)·(α + M·β) on a flat network, log2(P)·(α + M·β) for the global step. Concurrent group operations of one rank
  (when it lags behind) are not serialized and do not share its NIC.

  A late member's share of a group operation is recorded on it when it arrives, split over its iterations as they
  ran (the operation may have run during its previous iteration).

  Options for implementations that are not wait-avoiding (e.g. a blocking group allreduce over gloo or NCCL
  subgroups, which validate.ranks.decentralized runs): comm.wait_for_group = true starts a group operation when its last
  member arrives and makes every member wait for it, as the global step does; comm.global_collective = true costs the
  global step as comm.collective's allreduce among all ranks (a ring for gloo) instead of recursive doubling;
  comm.group_collective = true costs each group operation as the ring allreduce a subgroup runs there (gloo's ring):
  2(S-1) steps in which every member sends M/S bytes to the next member of its group, all groups at once, each step
  timed by simfog.p2p.exchange_times (so groups crossing one NIC share it) and lasting its group's slowest message.
  For S = 2 that is 2α + M·β where recursive doubling pays α + M·β.

  Every group and global operation also takes comm.collective_overhead_s (simfog.overheads: the host's work per
  operation, e.g. the validator's measured in-step excess) on top of its network cost; 0 unless given or measured.

- async (BaguaSys/bagua bagua/torch_api/algorithms/async_model_average.py, AsyncModelAverageAlgorithm): a background
  thread loops: negotiate (a 1-byte broadcast from rank 0), allreduce a snapshot of the weights among all ranks,
  sleep comm.async_period (sync_interval_ms = 500). The training loop never waits. The weight lock the thread
  takes while copying weights in and out is not modelled (device copies, short), nor is the bandwidth the
  averaging takes from gradient traffic (there is none: no gradients are communicated).
"""

from simfog.algorithms.dynamic.program import WAGMA, AsyncModelAverage
from simfog.algorithms.registry import REGISTRY

REGISTRY.register("wagma")(WAGMA)
REGISTRY.register("async")(AsyncModelAverage)
# Horovod's cycles run under the name "allreduce" (merge = "horovod"): AllreduceSGD.for_experiment picks them.
