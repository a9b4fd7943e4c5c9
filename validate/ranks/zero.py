"""Real runs of ZeRO stage 2 for the validator, replay or model mode, gloo on CPU: DeepSpeed's schedule as simfog
models it (simfog.algorithms.sharded, "zero1, zero2"), written by hand around the replay model (DeepSpeed itself is not
installed here, and its CPU path would not use gloo).

- Gradient buckets: the simulator's own (`zero_buckets` of the trace's ready order, `reduce_bucket_size`
  elements). Bucket b is reduced when the first gradient of bucket b+1 is ready (a post-accumulate-grad hook on
  that parameter: DeepSpeed's reduce_independent_p_g_buckets_and_remove_grads), the last one after backward
  (independent_gradient_partition_epilogue). The gradients are copied into the bucket's flat buffer (DeepSpeed's
  ipg buffer), which is allreduced (zero_reduce = "allreduce", DeepSpeed's default path).
- overlap_comm false (stage 2's default): the reduction blocks the rank's thread, i.e. backward stops while it
  runs; its time moves the replay's backward deadlines (`ReplayModel.blocked`). overlap_comm true: the allreduce
  is asynchronous and the rank first waits for the previous bucket's (average_tensor's wait_stream).
- The optimizer step (a replayed wait) is divided by the ranks (simfog: 1/N of the parameters), then the updated
  parameters are all-gathered in `allgather_bucket_size` shards (all_gather_dp_groups), blocking: a flat buffer of
  the model's elements, each rank contributing its 1/N slice.

Model mode (the real model): each bucket's gradients are divided by N before the sum (the mean, as DeepSpeed's
average_tensor), the reduced bucket is copied into a flat gradient, and an SGD-with-momentum optimizer steps an fp32
copy of this rank's partition only (1/N of the elements: its slice of each all-gather shard); the all-gather then
carries the updated partitions and the gathered vector is copied back into the model's parameters (DeepSpeed's
parameters are views of its flat buffer; the copy is the cost of not having one).

Collectives are recorded under the simulated plan's names ("reduce.bucket<b>", "allgather.params<s>"). Not run:
zero1, zero3, zero_reduce = "reduce", mixed precision. torch is imported inside the functions that
need it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from simfog.errors import ConfigError

ZERO2_NOTE = ("zero2: hand-written DeepSpeed stage-2 schedule on gloo (bucket allreduce when the next bucket's first "
              "gradient is ready, blocking unless overlap_comm; 1/N optimizer; parameter all-gather)")


def check_experiment(exp, mode: str, backend: str) -> None:
    """Raise ConfigError for a zero2 experiment the validator cannot run (see the module docstring)."""
    from validate.ranks.fsdp import check_sharded

    check_sharded(exp, mode, backend, "zero2", modes=("replay", "model"))
    if exp.comm.zero_reduce != "allreduce":
        raise ConfigError("comm.zero_reduce", exp.comm.zero_reduce, "allreduce for the validator", source=exp.source)


def worker_fields(sim) -> dict:
    """The worker configuration fields of a zero2 experiment from `sim` (a simfog.simulation.Simulation of it):
    "algorithm", "zero_buckets" (tensor names per bucket, ready order), "overlap", "allgather_shards",
    "collectives" (the plan's names, in plan order) and "optimizer_shards"."""
    from simfog.algorithms.sharded.plan import zero_buckets

    alg, exp = sim.algorithm, sim.experiment
    buckets = zero_buckets(exp.workload.trace.ready_tensors(), exp.comm.reduce_bucket_size)
    names = [c.name for c in alg.plan.colls]
    return {"algorithm": "zero2", "zero_buckets": [[t.name for t in b] for b in buckets],
            "overlap": bool(alg.overlap), "allgather_shards": sum(n.startswith("allgather.") for n in names),
            "collectives": names, "optimizer_shards": alg.shards}


class Zero2:
    """The real communication of one rank (see the module docstring): `start_iteration`, hooks during backward,
    `finish()` before the optimizer, `after_optimizer()` after it; `launch_s`, `done_s`, `launch_order` by the
    plan's collective index."""

    def __init__(self, params: Mapping, cfg: Mapping, rank: int, world: int, blocked=lambda seconds: None,
                 train: bool = False):
        import torch

        self.params, self.cfg, self.rank, self.world, self.blocked = params, cfg, rank, world, blocked
        self.names = list(cfg["collectives"])
        self.buckets = [list(b) for b in cfg["zero_buckets"]]
        dtype = next(iter(params.values())).dtype
        self.flat = [torch.zeros(sum(params[n].numel() for n in b), dtype=dtype) for b in self.buckets]
        elements = sum(p.numel() for p in params.values())
        shards = int(cfg["allgather_shards"])
        per = -(-elements // (shards * world)) * world  # each shard divisible among the ranks
        self.gathered = [torch.zeros(per, dtype=dtype) for _ in range(shards)]
        closes = {b[0]: k for k, b in enumerate(self.buckets[1:])}  # bucket k closes when bucket k+1 starts
        self._handles = [params[n].register_post_accumulate_grad_hook(lambda _p, k=k: self._reduce(k))
                         for n, k in closes.items()]
        self.overlap = bool(cfg["overlap"])
        self.optimizer = self._partition_optimizer() if train else None
        self.start_iteration()

    # --- model mode: real averaged gradients, an optimizer over this rank's partition only --------------------------

    def _partition(self):
        """Slices of the flat parameter vector (parameters in `params` order, zero-padded to the gathered shards)
        that this rank owns: its 1/N of each all-gather shard, as after_optimizer contributes them."""
        per = self.gathered[0].numel()
        part = per // self.world
        return [slice(s * per + self.rank * part, s * per + (self.rank + 1) * part) for s in range(len(self.gathered))]

    def _flat(self, tensors):
        import torch

        flat = torch.cat([t.reshape(-1) for t in tensors])
        total = sum(g.numel() for g in self.gathered)
        return torch.nn.functional.pad(flat, (0, total - flat.numel()))

    def _partition_optimizer(self):
        """SGD with momentum (as validate.collect.collect_model) over an fp32 copy of this rank's partition."""
        import torch

        flat = self._flat([p.detach() for p in self.params.values()])
        self.master = torch.nn.Parameter(torch.cat([flat[s] for s in self._partition()]).clone())
        self.grad_flat = torch.zeros_like(flat)
        self.offsets, offset = {}, 0
        for name, p in self.params.items():
            self.offsets[name] = offset
            offset += p.numel()
        return torch.optim.SGD([self.master], lr=0.01, momentum=0.9)

    def step(self) -> None:
        """Model mode: the rank's partition of the averaged gradient into its optimizer, one step (1/N of the
        parameters, as DeepSpeed's stage 2 updates)."""
        import torch

        self.master.grad = torch.cat([self.grad_flat[s] for s in self._partition()])
        self.optimizer.step()

    def start_iteration(self) -> None:
        n = len(self.names)
        self.launch_s, self.done_s = [float("nan")] * n, [float("nan")] * n
        self.launch_order: list[int] = []
        self._pending = None  # (work, index) of the reduction in flight (overlap_comm)

    def _wait(self, work, i: int, k: int) -> None:
        t = time.perf_counter()
        work.wait()
        now = time.perf_counter()
        self.done_s[i] = now
        self.blocked(now - t)
        if self.optimizer is not None:  # model mode: the reduced bucket into the flat gradient
            offset = 0
            for name in self.buckets[k]:
                n = self.params[name].numel()
                start = self.offsets[name]
                self.grad_flat[start:start + n].copy_(self.flat[k][offset:offset + n])
                offset += n

    def _reduce(self, k: int) -> None:
        import torch.distributed as dist

        if self._pending is not None:  # the previous reduction first (overlap_comm's wait_stream)
            self._wait(*self._pending)
            self._pending = None
        flat, offset = self.flat[k], 0
        for name in self.buckets[k]:  # into the bucket's flat buffer (DeepSpeed's ipg buffer)
            g = self.params[name].grad
            flat[offset:offset + g.numel()].copy_(g.reshape(-1))
            offset += g.numel()
        i = self.names.index(f"reduce.bucket{k}")
        self.launch_s[i] = time.perf_counter()
        self.launch_order.append(i)
        if self.optimizer is not None:
            flat.div_(self.world)  # the mean, computed before the sum (average_tensor's pre-division)
        work = dist.all_reduce(flat, async_op=True)
        if self.overlap:
            self._pending = (work, i, k)
        else:
            self._wait(work, i, k)

    def finish(self) -> None:
        """The last bucket (the epilogue), then every reduction done."""
        self._reduce(len(self.buckets) - 1)
        if self._pending is not None:
            self._wait(*self._pending)
            self._pending = None

    def after_optimizer(self) -> None:
        """The updated parameters all-gathered, shard by shard, blocking."""
        import torch.distributed as dist

        offset = 0
        for s, out in enumerate(self.gathered):
            part = out.numel() // self.world
            mine = out[self.rank * part:(self.rank + 1) * part]
            if self.optimizer is not None:  # model mode: this rank's updated partition
                mine.copy_(self.master.detach()[offset:offset + part])
                offset += part
            i = self.names.index(f"allgather.params{s}")
            self.launch_s[i] = time.perf_counter()
            self.launch_order.append(i)
            dist.all_gather_into_tensor(out, mine.clone())
            self.done_s[i] = time.perf_counter()
        if self.optimizer is not None:  # the gathered parameters back into the model (DeepSpeed's are views)
            import torch

            whole, offset = torch.cat(self.gathered), 0
            for p in self.params.values():
                p.data.copy_(whole[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def record(self) -> dict:
        return {"names": list(self.names)}

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def communication_matches(cfg: Mapping, per_rank: Sequence[Mapping]) -> bool:
    """True when every rank launched exactly the plan's collectives, in plan order, every iteration."""
    want = list(range(len(cfg["collectives"])))
    return all(len(r["iterations"]) == cfg["iterations"] and all(d["launch_order"] == want for d in r["iterations"])
               for r in per_rank)
