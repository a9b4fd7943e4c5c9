"""Sharded data parallelism: parameters, gradients and optimizer states split among ranks (FSDP2, HSDP, ZeRO 1-3).

Every rank holds 1/N of the state and gathers what it computes with just before it needs it, so communication gates
compute; each algorithm therefore runs whole iterations itself (`run_iteration`) from a static `Plan`: compute steps
(forward or backward of some layers), collectives issued when a step is reached (all-gathers, prefetches), collectives
a step waits for, and gradient hooks after a step. Each rank has separate communication streams, each running its
collectives in issue order (FIFO), beside the compute stream; a collective starts when every rank of its group has
issued it, its stream is free and its process group's previous collective has ended (one communicator runs one
collective at a time, in the order the rank issued them on any stream: NCCL serialises the kernels of a communicator,
see NVIDIA/nccl#1262, and FSDP2 and DeepSpeed issue all-gathers and reduce-scatters on the same process group; gloo
runs them on concurrent threads that share the link, which ends the last of them as late), and lasts the cluster
cost model's time (`CostModel.time(op, bytes, members)`, M the
full buffer: an all-gather's output, a reduce-scatter's input) plus `collective_overhead_s` (simfog.overheads: the
host's work per collective, 0 unless measured or given). Sources: torch 2.x FSDP2
(torch/distributed/fsdp/_fully_shard/: _fsdp_param_group.py, _fsdp_state.py, _fsdp_collectives.py, _fsdp_param.py,
_fully_shard.py) and DeepSpeed (deepspeed/runtime/zero/: config.py, stage_1_and_2.py, stage3.py,
partitioned_param_coordinator.py; runtime/utils.py), read in 2026.

## fsdp (FSDP2 `fully_shard`)

- Units: `comm.fsdp_unit` groups consecutive layers, as nested `fully_shard` calls do: "layer" (one per layer, the
  usual per-block wrapping), "model" (one unit), a list of layer counts, or a size ("50MB": layers are added to a
  unit until its parameter bytes reach the size). A unit's parameters are gathered in one all-gather and its
  gradients reduce-scattered in one collective (FSDPParamGroup: foreach_all_gather, foreach_reduce). A unit without
  parameters communicates nothing.
- Forward: unit u computes once its all-gather has finished (pre_forward: unshard + wait_for_unshard). `prefetch`
  = k: when the compute stream reaches unit u, the all-gathers of units u..u+k are issued (k = 1 is FSDP2's
  implicit prefetch, where the CPU issues unit u+1's all-gather while unit u's kernels run;
  set_modules_to_forward_prefetch gives more; k = 0: no overlap). After its forward a unit is resharded when
  `reshard_after_forward` (default true here for every unit; FSDP2's None default keeps the root unsharded).
- Backward, from the last unit: with reshard_after_forward, unit u's parameters are all-gathered again (pre_backward)
  and the all-gathers of units u-1..u-k are issued with it (_backward_prefetch, k = 1 by default); without it, the
  parameters are still there. After unit u's backward (post_backward) the compute stream first waits for the
  reduce-scatter of the unit before it (post_backward waits on comm_ctx.reduce_scatter_state.event), then issues
  unit u's reduce-scatter on the reduce-scatter stream. The optimizer step waits for every reduce-scatter
  (finalize_backward -> _wait_for_post_backward).
- Streams: all-gathers on the all-gather stream, reduce-scatters on the reduce-scatter stream (FSDPCommContext):
  both overlap compute; on the one process group they run one at a time (above).
- Mixed precision (MixedPrecisionPolicy; FSDPParam.init_dtype_attrs): all-gathers move `param_dtype` bytes,
  reduce-scatters `reduce_dtype` bytes (None: the gradients' dtype, i.e. param_dtype).
- The optimizer updates only the local shard: simfog scales the trace's optimizer time by the shard fraction 1/N
  (elementwise optimizers; per-tensor launch costs are not modelled).

## hsdp (FSDP2 with a 2-D mesh: Replicate, Shard)

fsdp inside groups of G = `hsdp_group` consecutive ranks (default gpus_per_node): all-gather and reduce-scatter
among the G ranks; after unit u's reduce-scatter, an allreduce of its 1/G shard among the ranks holding the same
shard in every group, on a separate all-reduce stream (foreach_reduce: all_reduce_stream waits on the reduce-scatter
stream). The optimizer waits for the all-reduces too; it updates 1/G of the model.

## zero1, zero2 (DeepSpeed stage_1_and_2.py, DeepSpeedZeroOptimizer)

- Gradient buckets of at most `reduce_bucket_size` elements (default 5e8), filled in the order gradients are ready;
  a bucket is reduced when a gradient that does not fit arrives (reduce_independent_p_g_buckets_and_remove_grads:
  `bucket.elements + param.numel() > reduce_bucket_size`), i.e. at that gradient's ready time, and the last one at
  the end of backward (independent_gradient_partition_epilogue). A tensor larger than a bucket goes alone.
- With `overlap_comm` (default false for stage 1 and 2, true for 3: config.py overlap_comm_valid) buckets are
  reduced on the reduction stream, and before a bucket is issued the compute stream waits for the earlier
  reductions (average_tensor: current_stream().wait_stream(reduction_stream)). Without it, zero2 reduces each bucket
  on the compute stream (backward stops while it runs) and zero1 reduces nothing during backward: every bucket,
  in parameter order, after it (reduce_gradients; process_gradients reduces in hooks only when partition_gradients
  or overlap_comm).
- The reduction (`zero_reduce`): "allreduce" of each bucket, DeepSpeed's default path (reduce_scatter = true and
  use_multi_rank_bucket_allreduce = true: allreduce_and_scatter -> allreduce_bucket, each rank keeps its slice) or
  "reduce" (use_multi_rank_bucket_allreduce = false: one reduce per owning rank, costed as a reduce-scatter of the
  bucket, the same bytes; the n launches are not costed separately).
- After the optimizer step (on 1/N of the parameters) the updated parameters are all-gathered on the compute
  stream: all_gather_dp_groups, in max(1, P // allgather_bucket_size) equal shards (default 5e8 elements). DeepSpeed
  does one all_gather_into_tensor when the backend has it, which is what the default gives for P < 1e9 elements.

## zero3 (DeepSpeed stage3.py, PartitionedParameterCoordinator)

- Modules = the trace's layers. Before a module runs (forward, then backward in reverse), its parameters are
  all-gathered unless already available (fetch_sub_module); then the parameters of the next modules in the recorded
  order are prefetched in one all-gather, those not available, until `stage3_prefetch_bucket_size` elements
  (default 5e7) are on the way (the one crossing it included) or stage3_max_live_parameters (1e9) would be exceeded.
- After its forward a module is released unless it is used again within stage3_max_reuse_distance (1e9) elements
  of parameters in the recorded order (__params_to_release: kept iff 2·(elements of later modules) < 1e9) or the
  prefetcher already skipped its next use; after its backward it is released. Without a release the backward needs
  no all-gather.
- Gradients: buckets as zero2 (`bucket.elements > 0` in the test), reduce-scattered (__avg_scatter_grads) on
  reduce_and_partition_stream when overlap_comm (default true), else on the compute stream; at most 3 in flight:
  before issuing bucket b the compute stream waits for bucket b-3 (max_param_reduce_events = 2).
- Steady state only: the first iteration, which records the module order and does not prefetch, is not modelled;
  neither is stage3_param_persistence_threshold (small parameters kept whole).

## Memory per rank (`memory()`)

P elements, b_o the trace's dtype bytes, b_p param_dtype, b_r reduce_dtype, k optimizer states, N shards (hsdp G):
fsdp/hsdp: the highest point of FSDP2's allocations walked in order along the plan (simfog.algorithms.sharded.memory:
all-gather outputs until copied out, unsharded parameters until resharded, a unit's unsharded gradients until copied
into its reduce-scatter input, that input until the next reduce-scatter is issued, sharded gradients until zero_grad,
activations from forward to their layer's backward, a layer's output and input gradients while its backward runs), with
each part as it stands at that moment; optimizer k·P·b_o/N throughout. zero*: parameters P·b_p (zero3: P·b_p/N + the
live gathered modules), gradients P·b_p (zero1) or P·b_p/N, optimizer (k + 1 if b_p != b_o: the fp32 master
copy)·P·b_o/N, buffers reduce_bucket_size·b_p (twice with overlap_comm in zero1/2: the double buffer of setup_buckets);
activations the trace's, all alive at backward's start, activation gradients the largest pair of one layer's
(simfog.memory).

plan.py: the Plans; program.py: the event engine's program (`run_iteration`) and the algorithms; memory.py: FSDP2's
allocations walked along the plan; closed_form.py with closed_form_program.py and closed_form_records.py: the
program solved as a max-plus recurrence over every rank at once.
"""

from simfog.algorithms.registry import REGISTRY
from simfog.algorithms.sharded.program import FSDP, HSDP, Zero1, Zero2, Zero3

REGISTRY.register("fsdp")(FSDP)
REGISTRY.register("hsdp")(HSDP)
REGISTRY.register("zero1")(Zero1)
REGISTRY.register("zero2")(Zero2)
REGISTRY.register("zero3")(Zero3)
