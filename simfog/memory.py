"""Memory per rank: what one GPU must hold at the peak of an iteration, beside how long the iteration takes.

    peak = parameters + gradients + optimizer states + communication buffers + activations
           + activation gradients

- parameters, gradients: the trace's parameter bytes each (gradients in the parameters' dtype, as PyTorch keeps
  them), for every algorithm that keeps a full replica.
- optimizer states: per parameter byte, SGD none, SGD with momentum one buffer, Adam/AdamW two (exp_avg,
  exp_avg_sq), in the parameters' dtype (torch.optim keeps states like the parameter). `[workload] optimizer`.
- communication buffers, by what the framework allocates:
  - ddp: one flat buffer per bucket, every gradient copied in (torch DDP's Reducer with the default
    gradient_as_bucket_view=False): the gradients' bytes again;
  - horovod: the fusion buffer (HOROVOD_FUSION_THRESHOLD, 128 MiB by default), at most the model's gradients;
  - bagua and every policy that merges (threshold, mgwfbp, optimal): a flat buffer per bucket of more than one
    tensor (a single tensor is reduced in place); wfbp none; single one buffer of everything;
  - decentralized and asynchronous algorithms: one model-sized receive buffer (an estimate: BlueFog's neighbor
    averaging with k in-neighbours may hold k);
  - compressed algorithms as their allreduce policy (their smaller payloads are not subtracted).
- activations: what autograd keeps from forward until backward, the sum of the trace's per-layer
  `activation_bytes` (measured by `simfog collect model`/`simfog collect activations`); all of it is alive when
  backward starts, the peak. A trace without them leaves activations unknown, and the peak says so. The input
  batch is among them when the first layer saves it (a Linear or a convolution does).
- activation gradients: while a layer's backward runs, the gradient w.r.t. its output (which backward hands it: the
  trace's per-layer `output_bytes`) and the one w.r.t. its input (which it computes: the layer before's output,
  none for the first layer, whose input is the batch) are alive beside the activations; its activations and its
  output's gradient go when it is done (`gradient_bytes`). Here, summed with the other parts' peaks, they count
  as the most alive at once, the largest pair; fsdp's walk (simfog.algorithms.sharded.memory) follows them layer by
  layer. They were the difference between that walk and the allocator's peak of FSDP2 runs of the zoo MLP
  (validate.ranks.fsdp, model mode: -18 to -28 % without them, -0.1 % with them). A trace without `output_bytes`
  leaves them unknown, and the peak says so. Not counted: the gradient a residual branch holds for the other while
  the block's body runs backward (with convolution_backward's temporaries, ResNet-20's remaining -1 to -2 %).

Not modelled: the CUDA context and allocator caching and fragmentation (often 0.5-2 GB per GPU), workspace of
kernels (cuDNN, cuBLAS), the loss's and autograd's temporaries (e.g. cross-entropy's gradient of its log-softmax,
the size of the logits; convolution_backward's). `gpu_memory` checks compare the modelled peak; keep some margin.
Sizes in bytes (SI at the boundary: bytes are bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from simfog.errors import ConfigError

OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}
DEFAULT_OPTIMIZER = "momentum"  # what `simfog collect model` trains with (SGD, momentum 0.9)
HOROVOD_FUSION_BYTES = 128 * 2**20
BUCKETED = ("allreduce", "fp16", "bytegrad", "qadam", "powersgd")  # gradient allreduce in buckets


@dataclass(frozen=True)
class Memory:
    """Bytes per rank at the peak of an iteration; `activations_B` None when the trace does not record them,
    `activation_grads_B` None when it does not record the layers' output bytes. `notes`: how each part was counted
    (one line each)."""

    parameters_B: float
    gradients_B: float
    optimizer_B: float
    buffers_B: float
    activations_B: float | None
    activation_grads_B: float | None
    notes: tuple[str, ...] = ()

    @property
    def peak_B(self) -> float:
        """The modelled peak (activations and their gradients counted as 0 when unknown: see `complete`)."""
        return (self.parameters_B + self.gradients_B + self.optimizer_B + self.buffers_B
                + (self.activations_B or 0.0) + (self.activation_grads_B or 0.0))

    @property
    def complete(self) -> bool:
        return self.activations_B is not None and self.activation_grads_B is not None

    def summary(self) -> dict:
        """Flat summary fields (bytes)."""
        return {"memory_peak_B": self.peak_B, "memory_parameters_B": self.parameters_B,
                "memory_gradients_B": self.gradients_B, "memory_optimizer_B": self.optimizer_B,
                "memory_buffers_B": self.buffers_B, "memory_activations_B": self.activations_B,
                "memory_activation_grads_B": self.activation_grads_B, "memory_complete": self.complete}


def optimizer_states(optimizer: str) -> int:
    """Optimizer state buffers per parameter. Raises ConfigError for an unknown optimizer."""
    if optimizer not in OPTIMIZERS:
        raise ConfigError("workload.optimizer", optimizer, f"one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[optimizer]


def activations_B(trace) -> float | None:
    """The sum of the trace's per-layer activation bytes, or None when any layer lacks them."""
    values = [layer.activation_bytes for layer in trace.layers]
    return None if any(v is None for v in values) else float(sum(values))


def gradient_bytes(trace) -> tuple[tuple[float, float], ...] | None:
    """Per layer, the activation gradients alive while its backward runs (bytes): (w.r.t. its output, its
    output_bytes; w.r.t. its input, the previous layer's output_bytes, 0 for the first layer). None when any layer
    lacks output_bytes."""
    out = [layer.output_bytes for layer in trace.layers]
    if any(v is None for v in out):
        return None
    return tuple((float(o), float(out[i - 1]) if i else 0.0) for i, o in enumerate(out))


def activation_grads_B(trace) -> float | None:
    """The most activation-gradient bytes alive at once in backward (the largest pair of `gradient_bytes`), or
    None when unknown."""
    pairs = gradient_bytes(trace)
    return None if pairs is None else max((o + i for o, i in pairs), default=0.0)


def activation_grads_note(known: bool) -> str:
    return ("activation gradients: the largest pair of a layer's output and input gradients (the trace's "
            "output_bytes), beside every activation" if known else
            "activation gradients: UNKNOWN (the trace does not record output_bytes)")


def buffer_bytes(merge: str, buckets, model_B: float) -> tuple[float, str]:
    """(bytes, how) of the flat communication buffers of an allreduce with policy `merge` over `buckets`, each a
    (bytes, tensors) pair, for a model of `model_B` gradient bytes."""
    if merge == "ddp":
        return model_B, "ddp: one flat buffer per bucket (gradient_as_bucket_view=False), the gradients again"
    if merge == "horovod":
        return min(model_B, HOROVOD_FUSION_BYTES), "horovod: the fusion buffer (at most 128 MiB)"
    merged = float(sum(nbytes for nbytes, tensors in buckets if tensors > 1))
    return merged, f"{merge}: a flat buffer per bucket of more than one tensor"


def estimate(experiment, buckets=()) -> Memory:
    """Memory per rank of `experiment` (see the module docstring); `buckets`: the buckets the algorithm ran
    (Result.buckets: dicts with "bytes" and "tensors"), for the buffers. Sharded algorithms provide their own
    (`memory(experiment)` on the algorithm class), which this does not cover."""
    trace = experiment.workload.trace
    params = float(trace.nbytes)
    optimizer = getattr(experiment.workload, "optimizer", DEFAULT_OPTIMIZER)
    states = optimizer_states(optimizer)
    algorithm = experiment.comm.algorithm
    if algorithm in BUCKETED:
        pairs = [(float(b["bytes"]), int(b.get("tensors", 1))) for b in buckets]
        buffers, how = buffer_bytes(experiment.comm.merge, pairs, params)
    else:
        buffers, how = params, f"{algorithm}: one model-sized receive buffer (estimate)"
    acts, grads = activations_B(trace), activation_grads_B(trace)
    notes = (f"parameters and gradients: {params:.0f} B each ({trace.dtype})",
             f"optimizer {optimizer}: {states} state buffer(s) per parameter",
             f"buffers: {how}",
             "activations: " + ("the trace's per-layer activation_bytes, all alive when backward starts"
                                if acts is not None else "UNKNOWN (the trace does not record activation_bytes)"),
             activation_grads_note(grads is not None))
    return Memory(params, params, states * params, buffers, acts, grads, notes)
