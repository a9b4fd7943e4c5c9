"""One rank of a validation run: train a replayed or real model under one merge policy, and time everything.

Started by `validate.run` through `validate.launch.launcher`, never by hand:

    python -m validate.ranks.worker SPEC.json OUT_DIR
    python -m validate.ranks.worker --calibrate PLAN.json OUT_DIR --priority rt   (microbenchmarks for calibration)

The launcher's environment says who this rank is (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME;
LOCAL_RANK from torchrun or srun picks the GPU). SPEC.json lists configurations; every rank runs them all, one after
the other, in one process group of SPEC's "backend" ("gloo" on CPU, the default; "nccl" with one GPU per rank), and
writes OUT_DIR/rank<R>.json. A configuration (all times in seconds):

    id, mode ("replay" | "model"), trace (path of the ModelTrace), compute ("samples" | "mean"), seed,
    iterations (measured), warmup (dropped), merge (policy name), buckets (lists of tensor names in launch order,
    for every policy but "ddp"), bucket_cap_mb (for "ddp": None = torch's default), samples[iteration][rank] (the
    recorded iteration each rank replays, as simfog.engine draws it), slowdown[rank] (compute factors),
    delays[iteration][rank] (straggler delays added to forward), spin_s (replay waits); optionally algorithm
    ("allreduce" when absent; "neighbor" | "wagma" with the schedule fields of
    `validate.ranks.decentralized.worker_fields`; "fsdp" with those of `validate.ranks.fsdp.worker_fields`: the replay
    model is grouped in units and FSDP2 applied, one more unmeasured iteration records the memory peak; "zero2" with
    those of `validate.ranks.zero.worker_fields`; replay only).

Policies: "ddp" is torch DDP itself (`broadcast_buffers=False`: the simulator models gradients only), with a comm
hook equivalent to torch's default `allreduce_hook` that also notes when each bucket is launched and completes and
which parameters DDP put in it; every other policy runs `validate.ranks.buckets.BucketedAllreduce` with the given plan.
Decentralized algorithms average parameters instead (`validate.ranks.decentralized`): launched at backward start, waited
for before the optimizer step, one "bucket" (the flat parameters) per iteration.

Per measured iteration the rank records (perf_counter seconds, one clock for all processes of the machine):
start, forward_end, backward_end (the last gradient ready, or in replay the first layer's backward end if later),
optimizer_start (all communication done), end, and per bucket its launch and completion. With nccl these are
CUDA events on the device (validate.ranks.timing.CudaClock: when the GPU got there, not when the host queued it),
mapped onto perf_counter through one synchronisation at each iteration's start and end. A barrier before the
first measured iteration aligns the ranks; none follows (the simulator starts iteration k+1 at once, too).

Scheduling: once the process group is up, SPEC's "priority" ("rt" | "nice" | "none", see validate.cluster.scheduling)
moves every thread of the rank to real-time round-robin scheduling (or nice -20), so that other work on the
machine does not delay the ranks' and gloo's wake-ups; again after a configuration created process groups;
`--calibrate` runs the calibration microbenchmarks the same way. Torch-only module.

Each rank notes its steps for the launcher (`validate.launch.launcher.note_step`: joining the process group, per
iteration its compute and its wait for communication), so that a rank that hangs is named with what it was doing.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from simfog.errors import ConfigError
from simfog.trace import load_model_trace
from validate.cluster.scheduling import raise_priority
from validate.launch.launcher import end_with_launcher, note_step
from validate.ranks.buckets import BucketedAllreduce
from validate.ranks.gate import leave_at_end, wait_at_start
from validate.ranks.replay import SPIN_S, LayerTimes, ReplayModel, wait_until
from validate.ranks.timing import HostClock, clock_for, to_seconds

BACKENDS = ("gloo", "nccl")


class DDPTimer:
    """A DDP comm hook that allreduces and averages a bucket (as torch's default `allreduce_hook`), noting the
    launch and completion time of each bucket (by DDP's bucket index) and the parameter names in it."""

    def __init__(self, names_by_ptr: dict[int, str], world: int, clock=None):
        self.names_by_ptr, self.world, self.clock = names_by_ptr, world, clock or HostClock()
        self.start_iteration()

    def start_iteration(self) -> None:
        self.buckets: dict[int, list[str]] = {}
        self.launch_s: list = []  # stamps, by DDP bucket index
        self.done_s: list = []
        self.launch_order: list[int] = []

    def hook(self, state, bucket):
        b = bucket.index()
        self.buckets[b] = [self.names_by_ptr.get(p.data_ptr(), "?") for p in bucket.parameters()]
        buf = bucket.buffer()
        buf.div_(self.world)  # torch default_hooks._allreduce_fut: divide first
        grow = b + 1 - len(self.launch_s)
        self.launch_s += [float("nan")] * grow
        self.done_s += [float("nan")] * grow
        self.launch_s[b] = self.clock.stamp()
        self.launch_order.append(b)
        work = dist.all_reduce(buf, async_op=True)
        self.clock.on_done(work, self.done_s, b)
        return work.get_future().then(lambda fut: fut.value()[0])


def _check_model(trace, named: dict[str, torch.nn.Parameter]) -> None:
    """A zoo model matches its trace: the same parameter names and element counts."""
    traced = {t.name: t.elements for t in trace.tensors.values()}
    real = {n: p.numel() for n, p in named.items() if p.requires_grad}
    if traced != real:
        diff = sorted(set(traced.items()) ^ set(real.items()))[:3]
        raise ConfigError("workload.trace", trace.model, f"a trace of this very model (parameters differ: {diff})")


def _build(cfg: dict, trace, rank: int, device: torch.device):
    """(module, named parameters, forward() -> loss, optimizer step(seconds factor), replay model or None, bytes of
    the input batch held throughout), on `device`."""
    if cfg["mode"] == "replay":
        model = ReplayModel(trace, spin_s=cfg.get("spin_s", SPIN_S), device=device, units=cfg.get("units"))
        x = torch.zeros(1, requires_grad=True, device=device)
        return model, model.named_tensors(), (lambda net: net(x).sum()), None, model, 0
    from validate.collect import models

    torch.manual_seed(cfg["seed"])
    entry = models.get(trace.model)
    model = entry.build().train().to(device)
    named = dict(model.named_parameters())
    _check_model(trace, named)
    inputs, targets = entry.make_inputs(trace.batch_size, torch.Generator().manual_seed(cfg["seed"] + 1 + rank))
    inputs, targets = tuple(t.to(device) for t in inputs), targets.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # as validate.collect.collect_model
    batch_B = sum(t.numel() * t.element_size() for t in (*inputs, targets))
    return model, named, (lambda net: entry.loss(net(*inputs), targets)), optimizer, None, batch_B


def run_config(cfg: dict, rank: int, world: int, priority: str = "none", clock=None) -> dict:
    """Run one configuration on this rank (all ranks must call it together); threads it starts (process groups)
    get `priority` too (validate.cluster.scheduling.raise_priority). `clock`: validate.ranks.timing's clock of the
    rank's device (default HostClock: CPU). Returns its JSON-ready record."""
    clock = clock or HostClock()
    trace = load_model_trace(cfg["trace"])
    model, named, loss_of, optimizer, replay, batch_B = _build(cfg, trace, rank, clock.device)
    sharded = None
    if cfg.get("algorithm") == "fsdp":
        from validate.ranks import fsdp

        sharded = fsdp.make(model, cfg, clock)
        named = {}  # FSDP2 swaps the parameters; backward_end comes from the replay clock (model: backward's return)
        if optimizer is not None:  # model mode: the optimizer steps the sharded parameters FSDP2 put in place
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = LayerTimes.from_trace(trace, cfg["compute"]) if replay is not None else None
    slow = float(cfg["slowdown"][rank])
    last_ready = [float("nan")]

    def ready(_p):
        last_ready[0] = clock.stamp()

    handles = [p.register_post_accumulate_grad_hook(ready) for p in named.values()]  # first: fires before others
    buckets = timer = averaging = zero2 = None
    if sharded is not None:
        net = model
    elif cfg.get("algorithm") == "zero2":
        from validate.ranks.zero import Zero2

        net = model
        zero2 = (Zero2(named, cfg, rank, world, replay.blocked) if replay is not None
                 else Zero2(named, cfg, rank, world, train=True))
    elif cfg.get("algorithm", "allreduce") != "allreduce":
        from validate.ranks import decentralized

        net = model
        averaging = decentralized.make(cfg, named, rank)
    elif cfg["merge"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = None if clock.device.type == "cpu" else [clock.device]
        net = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cfg.get("bucket_cap_mb"),
                                      broadcast_buffers=False)
        timer = DDPTimer({p.data_ptr(): n for n, p in named.items()}, world, clock)
        net.register_comm_hook(None, timer.hook)
    else:
        net = model
        buckets = BucketedAllreduce(named, cfg["buckets"], clock=clock)
    comm = buckets or timer or averaging or sharded or zero2
    memory = None
    raise_priority(priority)  # gloo threads of process groups created above
    out = []
    warmup, iterations = cfg["warmup"], cfg["iterations"]
    # No cyclic garbage collection while timing: a full collection stalled a rank for up to ~90 ms here, at a
    # random iteration, which no simulator input accounts for (the traced compute had its own, averaged in).
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + iterations + (sharded is not None)):
            it = i - warmup
            profiler = None
            if it == iterations:  # one more, unmeasured, with torch's CPU allocator events: the memory peak
                profiler = fsdp.MemoryProfile(model, batch_B)
            note_step(f"{cfg['id']} iteration {i} of {warmup + iterations}: compute")  # before the clock starts
            s = cfg["samples"][min(max(it, 0), iterations - 1)][rank]
            if it == 0:
                dist.barrier()
            comm.start_iteration()
            clock.start_iteration()
            t0 = clock.stamp()
            if replay is not None:
                replay.set_iteration(times.forward_s[s] * slow, times.backward_s[s] * slow,  # host waits
                                     start_s=t0 if isinstance(t0, float) else time.perf_counter())
            loss = loss_of(net)
            delay = float(cfg["delays"][it][rank]) if 0 <= it < iterations else 0.0
            if delay > 0:  # a straggler: the host waits (on a GPU, after its queued forward has run)
                clock.settle()
                wait_until(time.perf_counter() + delay)
            t_f = clock.stamp()
            if replay is not None:  # the waits are the host's: a CUDA stamp is no anchor for them
                replay.start_backward(t_f if isinstance(t_f, float) else time.perf_counter())
            if averaging is not None:
                averaging.launch(i)
            if sharded is not None:
                sharded.backward_started()
            loss.backward()
            if sharded is not None and replay is None:  # model mode: FSDP2's last post-backward has run
                last_ready[0] = clock.stamp()
            # while the buckets are in flight; a rank stuck in its compute has not got this far (with ddp the wait
            # is inside backward, so a hang there cannot be told from one in the compute)
            note_step(f"{cfg['id']} iteration {i} of {warmup + iterations}: waiting for communication")
            if buckets is not None:
                buckets.finish()
            if averaging is not None:
                averaging.finish()
            if sharded is not None:
                sharded.finish()
            if zero2 is not None:
                zero2.finish()
            t_o = clock.stamp()
            if replay is not None:
                clock.settle()
                # a sharded optimizer steps 1/shards of the parameters (simfog scales its time so)
                replay.wait_optimizer(float(times.optimizer_s[s]) * slow / cfg.get("optimizer_shards", 1))
            elif zero2 is not None:
                zero2.step()  # its partition only
            else:
                optimizer.step()
            t_e = clock.stamp()
            if zero2 is not None:
                zero2.after_optimizer()
            clock.settle()  # every stamp of this iteration can be read now
            t_b = clock.seconds(last_ready[0])
            if replay is not None and replay.clock.backward_done_s is not None:
                t_b = replay.clock.backward_done_s if t_b != t_b else max(t_b, replay.clock.backward_done_s)
            for p in (model.parameters() if sharded is not None else named.values()):
                p.grad = None
            if profiler is not None:
                memory = profiler.stop()
            if it < 0 or it >= iterations:
                continue
            out.append({"start": clock.seconds(t0), "forward_end": clock.seconds(t_f), "backward_end": t_b,
                        "optimizer_start": clock.seconds(t_o), "end": clock.seconds(t_e),
                        "launch": to_seconds(clock, comm.launch_s), "done": to_seconds(clock, comm.done_s),
                        "launch_order": list(comm.launch_order),
                        **(averaging.record() if averaging is not None else {}),
                        **(sharded.record() if sharded is not None else {}),
                        **(zero2.record() if zero2 is not None else {})})
    finally:
        gc.enable()
        for h in handles:
            h.remove()
        if buckets is not None:
            buckets.remove()
        if averaging is not None:
            averaging.close()
        if zero2 is not None:
            zero2.close()
    if averaging is not None:
        return {"id": cfg["id"], "iterations": out, "buckets": [list(named)], "values": averaging.values}
    if sharded is not None or zero2 is not None:
        names = (sharded or zero2).names
        return {"id": cfg["id"], "iterations": out, "buckets": [[n] for n in names], "memory": memory}
    plan = cfg["buckets"] if buckets is not None else [timer.buckets[b] for b in sorted(timer.buckets)]
    return {"id": cfg["id"], "iterations": out, "buckets": plan}


def rank_device(backend: str, rank: int) -> torch.device:
    """The rank's device: the CPU for gloo; for nccl GPU LOCAL_RANK (set by torchrun and by srun's wrapper), else
    rank modulo the GPUs visible. Raises ConfigError when nccl is asked for where no GPU is visible."""
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return torch.device("cpu")
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise ConfigError("backend", backend, "gloo on a machine without a CUDA GPU (nccl needs one GPU per rank)")
    local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
    return torch.device("cuda", local)


def _init(timeout_s: float, backend: str = "gloo") -> tuple[int, int, torch.device]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = rank_device(backend, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    note_step(f"joining the {backend} process group")
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            **({"device_id": device} if device.type == "cuda" else {}))
    dist.barrier()  # every rank connected before any changes its scheduling
    return rank, world, device


def calibrate_main(plan_path: str, out_dir: str, priority: str, timeout_s: float, backend: str = "gloo") -> int:
    """Time a `validate.collect.collect_network` plan (barrier, then each call timed on every rank) on this rank and
    write out_dir/rank<R>.json as collect_network's workers do; the same scheduling and backend as the validation
    runs (nccl: buffers on the rank's GPU, the device synchronised around each timed call)."""
    from validate.collect.collect_network import time_plan, write_rank_result
    from validate.collect.collect_network_worker import make_op

    plan = json.loads(Path(plan_path).read_text())
    rank, world, device = _init(timeout_s, backend)
    applied = raise_priority(priority)
    note_step("timing the calibration microbenchmarks")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    try:
        samples = time_plan(plan, lambda c, b: make_op(c, b, rank, world, device), dist.barrier, sync)
    finally:
        dist.destroy_process_group()
    software = {"torch": torch.__version__}
    if device.type == "cuda":
        software.update(nccl=".".join(map(str, torch.cuda.nccl.version())), gpu=torch.cuda.get_device_name(device))
    write_rank_result(out_dir, rank, samples, {"threads": torch.get_num_threads(), "priority": priority,
                                               "priority_applied": applied, "backend": backend,
                                               "software": software})
    return 0


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    end_with_launcher()  # a rank never outlives the process that launched it
    p = argparse.ArgumentParser(description="one rank of a simfog validation run (started by validate.run)")
    p.add_argument("spec", help="SPEC.json written by validate.run (with --calibrate: a collect_network plan)")
    p.add_argument("out", help="directory for rank<R>.json")
    p.add_argument("--calibrate", action="store_true", help="time the microbenchmark plan SPEC instead")
    p.add_argument("--priority", choices=("rt", "nice", "none"), default="none", help="with --calibrate")
    p.add_argument("--timeout", type=float, default=600.0, help="with --calibrate: process group timeout (s)")
    p.add_argument("--backend", choices=BACKENDS, default="gloo", help="with --calibrate: the process group's")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.calibrate:
        return calibrate_main(a.spec, a.out, a.priority, a.timeout, a.backend)
    spec = json.loads(Path(a.spec).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    warnings.filterwarnings("ignore", category=UserWarning)  # DDP's notes about comm hooks and bucket views
    backend = spec.get("backend", "gloo")
    rank, world, device = _init(float(spec.get("timeout_s", 600)), backend)
    clock = clock_for(device)
    applied = raise_priority(spec.get("priority", "none"))
    if spec.get("gate"):
        wait_at_start(spec["gate"], rank)
    started = time.perf_counter()
    results = []
    finished = False
    try:
        for cfg in spec["configs"]:
            note_step(f"{cfg['id']}: setting up")
            dist.barrier()
            results.append(run_config(cfg, rank, world, spec.get("priority", "none"), clock))
        note_step("final barrier")
        dist.barrier()
        finished = True
    finally:
        if spec.get("gate"):
            note_step("end gate")
            leave_at_end(spec["gate"], rank, wait=finished)
        dist.destroy_process_group()
    _write(Path(a.out) / f"rank{rank}.json", {"rank": rank, "world": world, "configs": results,
                                              "wall_s": time.perf_counter() - started, "priority_applied": applied,
                                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                                              "backend": backend, "device": str(device)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
