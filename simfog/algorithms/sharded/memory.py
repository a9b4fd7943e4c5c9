"""FSDP2's memory per rank over one iteration, walked allocation by allocation along the plan.

Adding the peaks of parameters, gradients and buffers over-predicts: FSDP2 reaches them at different moments (it
reshards a unit after its backward and frees the unsharded gradients once copied into the reduce-scatter input).
This walk follows the order in which FSDP2 (torch 2.13, _fully_shard/_fsdp_param_group.py, _fsdp_collectives.py)
allocates and frees, checked against torch's allocator events of FSDP2 runs here (validate.ranks.fsdp.MemoryProfile):

- issuing unit v's all-gather allocates its flat output, v's elements in param dtype (`all_gather`);
- the unit's pre-forward / pre-backward waits for it, allocates the unsharded parameters and copies out
  (`all_gather_copy_out`: output and parameters both alive), then frees the output; then it issues the units it
  prefetches (the plan's other all-gathers of that step);
- forward keeps the unit's activations (the trace's activation_bytes); post-forward reshards (frees the unsharded
  parameters) when reshard_after_forward;
- backward holds the gradient w.r.t. the unit's output from before its pre-backward (the hook fires once that
  gradient exists; the last unit's comes from the loss's backward); then, layer by layer in reverse (autograd
  frees a node's inputs and saved tensors when it has run), each layer computes the gradient w.r.t. its input
  (simfog.memory.gradient_bytes) and its parameters' unsharded gradients (AccumulateGrad, param dtype) while its
  activations and its output's gradient are alive, then frees those two; the input's gradient is the layer
  before's output gradient, the first layer computes none. Checked against FSDP2 model-mode runs of the zoo
  MLP and ResNet-20 on gloo (validate.ranks.fsdp); post-backward reshards, waits for the previous reduce-scatter
  and frees its input,
  allocates this unit's reduce-scatter input (reduce dtype), frees the unsharded gradients and allocates the
  sharded gradient (the reduce-scatter output, the parameters' own dtype), which lives until zero_grad;
- after backward the last reduce-scatter input is freed; optimizer states are there throughout (after the first
  step), as are the sharded parameters.

Returns the breakdown at the highest point (`Memory`: each part as it stood then), so its parts add up to the peak.
FSDP2's per-parameter padding to a multiple of the shard count and allocator rounding are left out (a few bytes
per tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

from simfog.memory import Memory


@dataclass(frozen=True)
class UnitBytes:
    """Per unit: unsharded parameters (param dtype), all-gather output (the same bytes; 0 on one shard, where
    FSDP2 gathers nothing and allocates the parameters directly), reduce-scatter input (reduce dtype), sharded
    gradient (parameters' dtype / shards), and its layers in forward order, each (unsharded gradients (param
    dtype), activations kept from forward to backward, gradient w.r.t. its output, gradient w.r.t. its input).
    `activations_known` / `activation_grads_known` False: the trace lacks them (counted as 0, reported None)."""

    params: tuple[float, ...]
    gather_output: tuple[float, ...]
    reduce_input: tuple[float, ...]
    sharded_grad: tuple[float, ...]
    layers: tuple[tuple[tuple[float, float, float, float], ...], ...]
    activations_known: bool = True
    activation_grads_known: bool = True


def walk(plan, unit_of_step, bytes_: UnitBytes, resident_params_B: float, optimizer_B: float,
         notes: tuple[str, ...] = ()) -> Memory:
    """The peak of `plan` (simfog.algorithms.sharded.Plan of FSDP: all-gathers' `units` name the unit they gather;
    reduce-scatters are issued by the backward steps' hooks); `unit_of_step[s]` the unit of step s."""
    state = {"params": resident_params_B, "grads": 0.0, "buffers": 0.0, "acts": 0.0, "act_grads": 0.0}
    peak: dict = {}

    def add(part, nbytes):
        state[part] += nbytes
        if not peak or sum(state.values()) > sum(peak.values()):
            peak.clear()
            peak.update(state)

    unsharded: set[int] = set()
    gathering: set[int] = set()  # all-gather issued, not yet copied out
    reduce_inputs: list[float] = []  # of reduce-scatters in flight, oldest first

    def issue(c):
        for v in plan.colls[c].units:
            gathering.add(v)
            add("buffers", bytes_.gather_output[v])

    for s, step in enumerate(plan.steps):
        u = unit_of_step[s]
        layers = bytes_.layers[u]
        if step.kind != "forward":  # the gradient w.r.t. the unit's output, there before its pre-backward
            add("act_grads", layers[-1][2] - state["act_grads"])
        own = [c for c in step.issue if u in plan.colls[c].units]
        for c in own:
            issue(c)
        for c in step.need:
            for v in plan.colls[c].units:
                if v not in unsharded:
                    add("params", bytes_.params[v])
                    unsharded.add(v)
                if v in gathering:
                    gathering.discard(v)
                    add("buffers", -bytes_.gather_output[v])
        for c in step.issue:
            if c not in own:
                issue(c)
        if step.kind == "forward":
            add("acts", sum(acts for _, acts, _, _ in layers))
        else:
            for grads, acts, out_grad, in_grad in reversed(layers):
                add("act_grads", in_grad)
                add("grads", grads)
                add("act_grads", -out_grad)
                add("acts", -acts)
        for v in step.free:
            if v in unsharded:
                unsharded.discard(v)
                add("params", -bytes_.params[v])
        for _, c in step.hooks:
            if plan.colls[c].op != "reduce_scatter":
                continue  # hsdp's allreduce works in place on the reduce-scatter output
            if reduce_inputs:
                add("buffers", -reduce_inputs.pop(0))
            add("buffers", bytes_.reduce_input[u])
            reduce_inputs.append(bytes_.reduce_input[u])
            add("grads", -bytes_.params[u])
            add("grads", bytes_.sharded_grad[u])
    return Memory(peak["params"], peak["grads"], optimizer_B, peak["buffers"],
                  peak["acts"] if bytes_.activations_known else None,
                  peak["act_grads"] if bytes_.activation_grads_known else None, notes)
