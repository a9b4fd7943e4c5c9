"""Bucketed gradient allreduce driven by per-parameter hooks: every simfog merge policy other than torch DDP, for real.

`BucketedAllreduce` takes a bucket plan (lists of parameter names in launch order, e.g. from `simfog.merge.plan`)
and registers a `Tensor.register_post_accumulate_grad_hook` on every parameter. When a gradient is ready its hook
copies it into the bucket's flat buffer; when every gradient of a bucket is in, and every earlier bucket has been
launched, the bucket is divided by the world size and launched with `dist.all_reduce(async_op=True)`. So buckets
launch strictly in plan order, as DDP's reducer launches its buckets (a ready bucket waits for all earlier ones)
and as simfog's engine models them. `finish()` waits for all of them and copies the averages back into `.grad`:
call it after `loss.backward()` and before the optimizer step.

What happens when is stamped on a `validate.ranks.timing` clock: per bucket the launch (the `all_reduce` call; on a GPU,
when the compute stream gets there) and completion (the work's future firing in gloo's thread; on a GPU, the
NCCL kernel's end), and when the last gradient became ready. Buffers live on the parameters' device.

Division before the allreduce follows torch's default DDP comm hook (ddp_comm_hooks/default_hooks.py
`_allreduce_fut`: "Apply the division first to avoid overflow"). Torch-only module.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from simfog.errors import ConfigError
from validate.ranks.timing import HostClock


class BucketedAllreduce:
    """Hooks on `params` (name -> parameter) that allreduce their gradients in the buckets of `plan` (each a list
    of names; every parameter in exactly one bucket) among `group` (default: the world), averaging.

    Attributes after each iteration: `launch_s[b]`, `done_s[b]` (stamps of `clock`, default HostClock:
    perf_counter seconds), `launch_order` (bucket indices in the order launched), `last_ready_s`. Raises
    ConfigError when the plan does not cover the parameters exactly once or a bucket mixes dtypes."""

    def __init__(self, params: Mapping[str, torch.nn.Parameter], plan: Sequence[Sequence[str]], *, group=None,
                 clock=None):
        names = [n for bucket in plan for n in bucket]
        missing, extra = set(params) - set(names), set(names) - set(params)
        if missing or extra or len(names) != len(set(names)):
            raise ConfigError("buckets", sorted(missing | extra)[:5] or names,
                              "a plan with every parameter of the model exactly once")
        self.group = group
        self.clock = clock or HostClock()
        self.world = dist.get_world_size(group)
        self.plan = [list(b) for b in plan]
        self.params = dict(params)
        self.buffers: list[torch.Tensor] = []
        self.views: dict[str, tuple[int, torch.Tensor]] = {}  # name -> (bucket, view into its buffer)
        for b, bucket in enumerate(self.plan):
            dtypes = {self.params[n].dtype for n in bucket}
            if len(dtypes) != 1:
                raise ConfigError(f"buckets[{b}]", sorted(map(str, dtypes)), "tensors of one dtype per bucket")
            buf = torch.zeros(sum(self.params[n].numel() for n in bucket), dtype=dtypes.pop(),
                              device=self.params[bucket[0]].device)
            offset = 0
            for n in bucket:
                k = self.params[n].numel()
                self.views[n] = (b, buf[offset:offset + k])
                offset += k
            self.buffers.append(buf)
        self._lock = threading.Lock()  # hooks run in autograd threads; completions in gloo's
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in self.params.items()]
        self.start_iteration()

    def start_iteration(self) -> None:
        """Reset the per-iteration state; call before each backward."""
        self.pending = [len(b) for b in self.plan]
        self.next_launch = 0
        self.works: list = []
        self.launch_s = [float("nan")] * len(self.plan)
        self.done_s = [float("nan")] * len(self.plan)
        self.launch_order: list[int] = []
        self.last_ready_s = float("nan")

    def _hook(self, name: str):
        def hook(p: torch.Tensor) -> None:
            self.last_ready_s = self.clock.stamp()
            b, view = self.views[name]
            view.copy_(p.grad.reshape(-1))
            with self._lock:
                self.pending[b] -= 1
                while self.next_launch < len(self.plan) and self.pending[self.next_launch] == 0:
                    self._launch(self.next_launch)
                    self.next_launch += 1
        return hook

    def _launch(self, b: int) -> None:
        buf = self.buffers[b]
        buf.div_(self.world)
        self.launch_s[b] = self.clock.stamp()
        self.launch_order.append(b)
        work = dist.all_reduce(buf, group=self.group, async_op=True)
        self.clock.on_done(work, self.done_s, b)
        self.works.append(work)

    def finish(self) -> None:
        """Wait for every bucket (in launch order) and copy the averaged gradients into each parameter's `.grad`.
        Raises RuntimeError naming the parameters whose gradient never became ready."""
        if self.next_launch < len(self.plan):
            waiting = [n for b in self.plan[self.next_launch:] for n in b if self.params[n].grad is None]
            raise RuntimeError(f"bucket {self.next_launch} was never launched: no gradient for "
                               f"{', '.join(waiting[:5]) or 'some of its parameters'}")
        for work in self.works:
            work.wait()
        for b in range(len(self.works)):  # a future's callback may still be running just after wait()
            if self.done_s[b] != self.done_s[b]:  # NaN (HostClock only)
                self.done_s[b] = self.clock.stamp()
        for name, (_, view) in self.views.items():
            p = self.params[name]
            p.grad.copy_(view.view_as(p.grad))

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
