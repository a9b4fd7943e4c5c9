"""The validator's rank program: hook-based bucketed allreduce against torch DDP, and the replay model's waits.

The allreduce tests run 2 ranks over gloo on loopback (spawned processes, a FileStore rendezvous). Every policy's
plan, run by `BucketedAllreduce`, must give exactly the averaged gradients that torch DDP computes, and launch its
buckets in plan order; DDP's own buckets (read by the worker's timing comm hook) must be simfog's "ddp" plan.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest

from simfog import merge
from simfog.cluster import Cluster, Link
from simfog.collectives import CostModel
from simfog.engine.compute import ComputeModel
from simfog.errors import ConfigError
from simfog.trace import Layer, ModelTrace, Provenance, Tensor

torch = pytest.importorskip("torch", reason="the validator's worker needs torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from validate.ranks.buckets import BucketedAllreduce  # noqa: E402
from validate.ranks.replay import LayerTimes, ReplayModel  # noqa: E402
from validate.ranks.worker import DDPTimer  # noqa: E402

POLICIES = ("wfbp", "single", "threshold", "ddp", "bagua", "mgwfbp", "horovod")
THRESHOLD = 1200  # bytes: small enough that every size-driven policy makes several buckets of the tiny model
SHAPES = [(8, 16), (16, 16), (16, 24), (24, 4)]  # Linear(in, out): weights 512, 1024, 1536, 384 B


def _tiny():
    layers = []
    for i, (a, b) in enumerate(SHAPES):
        layers.append(torch.nn.Linear(a, b))
        if i < len(SHAPES) - 1:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def _trace_of(model, ready_order, fwd_s=1e-3, bwd_s=2e-3) -> ModelTrace:
    """A ModelTrace whose layers are the model's leaf modules and whose ready order is the one observed."""
    layers = []
    for name, module in model.named_children():
        params = tuple(Tensor(f"{name}.{n}", p.numel()) for n, p in module.named_parameters())
        layers.append(Layer(name, (fwd_s,), (bwd_s,), params))
    return ModelTrace("tiny", 4, "float32", {"kind": "cpu"}, {}, Provenance("test", "2026-11-21", "test"),
                      tuple(layers), tuple(ready_order), optimizer_s=(0.0,))


def _settings(policy):
    return merge.MergeSettings(threshold_bytes=THRESHOLD if policy in ("threshold", "ddp", "bagua", "horovod")
                               else None)


def _rank_main(rank: int, world: int, store_path: str, out_dir: str) -> None:
    """One rank: observe the ready order, then per policy the hook path; torch DDP as the reference."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        base = _tiny()
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(100 + rank))  # different data per rank
        loss_of = lambda m: m(x).pow(2).sum()
        order = []
        probe = copy.deepcopy(base)
        for n, p in probe.named_parameters():
            p.register_post_accumulate_grad_hook(lambda t, n=n: order.append(n))
        loss_of(probe).backward()
        trace = _trace_of(base, order)
        tensors = merge.grad_tensors(trace)
        cost = CostModel(Cluster(world, 1, Link(1e-6, 1e10), Link(50e-6, 1.25e8)), "ring")

        # Reference: torch DDP itself, default comm, one iteration (its first-iteration buckets are irrelevant to
        # the averages).
        ref = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), broadcast_buffers=False)
        loss_of(ref).backward()
        reference = {n: p.grad.clone() for n, p in ref.module.named_parameters()}

        out = {"order": order, "reference": reference, "policies": {}}
        for policy in POLICIES:
            plan = [list(b.tensors) for b in merge.plan(policy, tensors, _settings(policy), cost.allreduce)]
            model = copy.deepcopy(base)
            hooks = BucketedAllreduce(dict(model.named_parameters()), plan)
            launched = []
            for _ in range(2):  # twice: the per-iteration state must reset
                hooks.start_iteration()
                loss_of(model).backward()
                hooks.finish()
                launched.append([hooks.plan[b] for b in hooks.launch_order])
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                done_after_launch = all(d >= s for s, d in zip(hooks.launch_s, hooks.done_s, strict=True))
                model.zero_grad(set_to_none=True)
            hooks.remove()
            out["policies"][policy] = {"plan": plan, "launched": launched, "grads": grads,
                                       "done_after_launch": done_after_launch}

        # DDP with the worker's timing comm hook and simfog's "ddp" plan for the same cap: DDP rebuilds its
        # buckets from the observed ready order after iteration 1, so iteration 3 shows the rebuilt ones.
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base), broadcast_buffers=False,
                                                        bucket_cap_mb=THRESHOLD / merge.MiB)
        timer = DDPTimer({p.data_ptr(): n for n, p in ddp.module.named_parameters()}, world)
        ddp.register_comm_hook(None, timer.hook)
        for _ in range(3):
            timer.start_iteration()
            ddp.zero_grad(set_to_none=True)
            loss_of(ddp).backward()
        out["ddp_timer"] = {"buckets": [timer.buckets[b] for b in sorted(timer.buckets)],
                            "launch_order": timer.launch_order,
                            "grads": {n: p.grad.clone() for n, p in ddp.module.named_parameters()}}
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()



@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run `_rank_main` on 2 spawned ranks; returns their outputs."""
    import torch.multiprocessing as mp

    tmp = tmp_path_factory.mktemp("ranks")
    mp.start_processes(_rank_main, args=(2, str(tmp / "store"), str(tmp)), nprocs=2, start_method="spawn",
                       join=True)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("policy", POLICIES)
def test_hook_buckets_average_like_ddp(two_ranks, policy):
    for out in two_ranks:
        got, ref = out["policies"][policy]["grads"], out["reference"]
        assert set(got) == set(ref)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-6, atol=1e-7, msg=f"{policy}: {name}")
    # and the ranks agree: an allreduce leaves the same average everywhere
    for name, g in two_ranks[0]["policies"][policy]["grads"].items():
        torch.testing.assert_close(g, two_ranks[1]["policies"][policy]["grads"][name], rtol=0, atol=0)


@pytest.mark.parametrize("policy", POLICIES)
def test_buckets_launch_in_plan_order(two_ranks, policy):
    for out in two_ranks:
        res = out["policies"][policy]
        assert all(launched == res["plan"] for launched in res["launched"])
        assert res["done_after_launch"]
    plans = {p: len(two_ranks[0]["policies"][p]["plan"]) for p in POLICIES}
    # the test means something: one bucket per tensor, one for everything, and several in between
    assert plans["wfbp"] == 8 and plans["single"] == 1 and 1 < plans["threshold"] < 8


def test_ddp_buckets_are_simfogs_ddp_plan(two_ranks):
    out = two_ranks[0]
    timer = out["ddp_timer"]
    # the "ddp" plan for the same cap, from the ready order both DDP and the trace observed
    assert timer["buckets"] == out["policies"]["ddp"]["plan"]
    assert timer["launch_order"][-len(timer["buckets"]):] == list(range(len(timer["buckets"])))
    assert len(timer["buckets"]) > 1
    for name, g in out["reference"].items():  # the timing hook averages as DDP's default does
        torch.testing.assert_close(timer["grads"][name], g, rtol=1e-6, atol=1e-7)


def test_plan_must_cover_every_parameter_once():
    model = _tiny()
    params = dict(model.named_parameters())
    names = list(params)
    with pytest.raises(ConfigError, match="exactly once"):
        BucketedAllreduce(params, [names[:-1]])
    with pytest.raises(ConfigError, match="exactly once"):
        BucketedAllreduce(params, [names, names[:1]])


# ---- the replay model ----

def _replay_trace() -> ModelTrace:
    """6 layers (two without parameters), 2 recorded iterations; times in seconds, chosen distinct."""
    fwd = [[2e-3, 1e-3, 3e-3, 0.5e-3, 2e-3, 1e-3], [2.5e-3, 1e-3, 3e-3, 0.5e-3, 2e-3, 1.5e-3]]
    bwd = [[4e-3, 2e-3, 6e-3, 1e-3, 4e-3, 3e-3], [4e-3, 2.5e-3, 6e-3, 1e-3, 5e-3, 3e-3]]
    params = [(("a.w", 300), ("a.b", 10)), (), (("c.w", 2000), ("c.b", 20), ("c.s", 20)), (), (("e.w", 50),),
              (("f.w", 7), ("f.b", 1))]
    layers = tuple(Layer(n, tuple(f[i] for f in fwd), tuple(b[i] for b in bwd), tuple(Tensor(*t) for t in ps))
                   for i, (n, ps) in enumerate(zip("abcdef", params, strict=True)))
    # ready order: reverse layers; within a layer deliberately not the declaration order
    order = ("f.b", "f.w", "e.w", "c.s", "c.w", "c.b", "a.b", "a.w")
    return ModelTrace("synthetic", 1, "float32", {"kind": "cpu"}, {}, Provenance("test", "2026-11-21", "test"),
                      layers, order, optimizer_s=(1e-3, 2e-3))


@pytest.mark.parametrize("mode, ranks", [("samples", ()), ("mean", ()), ("replay", ()), ("mean", (0, 1))])
def test_layer_times_are_the_engines(mode, ranks):
    from dataclasses import replace

    trace = replace(_replay_trace(), sample_ranks=ranks)
    lt, cm = LayerTimes.from_trace(trace, mode), ComputeModel.from_trace(trace, mode)
    np.testing.assert_allclose(lt.forward_s.sum(1), cm.forward_s, rtol=1e-12)
    np.testing.assert_allclose(np.cumsum(lt.backward_s[:, ::-1], axis=1)[:, ::-1], cm.layer_end_s, rtol=1e-12)
    np.testing.assert_allclose(lt.optimizer_s, cm.optimizer_s, rtol=1e-12)


def test_replay_waits_follow_the_trace():
    """Structural: with deadlines at pass start + cumulative traced time, layer k can never end before that
    deadline, forward runs layers in order and backward in reverse, and gradients become ready in the trace's
    order right after their layer. The total may exceed the traced one only by wake-up lateness: generously
    bounded by 50 % + 20 ms (a loaded 2-core machine delays a wake-up by milliseconds at worst; 50 % of these
    ~20 ms passes would need ten such delays)."""
    trace = _replay_trace()
    model = ReplayModel(trace)
    names = model.tensor_names
    ready = []
    for p, n in names.items():
        p.register_post_accumulate_grad_hook(lambda t, n=n: ready.append((n, time.perf_counter())))
    lt = LayerTimes.from_trace(trace, "samples")
    assert len(list(model.parameters())) == 8
    assert {n: p.numel() for n, p in model.named_tensors().items()} == {t.name: t.elements
                                                                       for t in trace.tensors.values()}
    for s in range(lt.samples):
        ready.clear()
        t0 = time.perf_counter()
        model.set_iteration(lt.forward_s[s], lt.backward_s[s], start_s=t0, record=True)
        y = model(torch.zeros(1, requires_grad=True))
        t_b = time.perf_counter()
        model.start_backward(t_b)
        y.sum().backward()
        events = model.clock.events
        fwd = [e for e in events if e[1] == "forward"]
        bwd = [e for e in events if e[1] == "backward"]
        assert [e[0] for e in fwd] == list(range(6)) and [e[0] for e in bwd] == list(range(5, -1, -1))
        cum_f = np.cumsum(lt.forward_s[s])
        cum_b = np.cumsum(lt.backward_s[s][::-1])  # backward of layers 5, 4, ..., 0
        eps = 1e-9  # float rounding of perf_counter differences (~8000 s clocks), not an early wake-up
        for k, e in enumerate(fwd):
            assert e[3] - t0 >= cum_f[k] - eps
        for k, e in enumerate(bwd):
            assert e[3] - t_b >= cum_b[k] - eps
        assert [n for n, _ in ready] == list(trace.grad_ready_order)
        end_of = {e[0]: e[3] for e in bwd}
        layer_of = {t.name: i for i, layer in enumerate(trace.layers) for t in layer.params}
        for n, t in ready:
            assert t >= end_of[layer_of[n]]  # a gradient is ready only after its layer's backward
        for p in names:
            p.grad = None


def test_replay_gradients_are_fresh_zeros_that_accumulate_grad_takes_without_a_copy(monkeypatch):
    """Each iteration every parameter gets a new all-zero gradient, the very tensor its _Attach node handed out
    (AccumulateGrad took it, as it takes a real layer's fresh gradient, instead of cloning a kept one after the last
    deadline), and the model keeps no reference to it."""
    from validate.ranks import replay

    handed = {}
    plain = replay._Attach.backward

    def recording(ctx, g):
        out = plain(ctx, g)
        handed[ctx.layer, ctx.k] = out[1].data_ptr()
        return out

    monkeypatch.setattr(replay._Attach, "backward", staticmethod(recording))
    trace = _replay_trace()
    model = ReplayModel(trace)
    lt = LayerTimes.from_trace(trace, "samples")
    seen = []
    for s in range(2):
        handed.clear()
        model.set_iteration(lt.forward_s[s] * 0, lt.backward_s[s] * 0)
        model(torch.zeros(1, requires_grad=True)).sum().backward()
        grads = {n: p.grad for n, p in model.named_tensors().items()}
        assert all(g is not None and not g.any() for g in grads.values())
        assert {n: g.data_ptr() for n, g in grads.items()} == {n: handed[w] for n, w in model._where.items()}
        assert all(x is None for fresh in model.clock.fresh for x in fresh)
        seen.append(grads)
        for p in model.parameters():
            p.grad = None
    assert all(seen[0][n] is not seen[1][n] for n in seen[0])


def test_replay_optimizer_waits():
    model = ReplayModel(_replay_trace())
    t0 = time.perf_counter()
    assert model.wait_optimizer(3e-3) - t0 >= 3e-3


def test_the_end_gate_holds_each_rank_until_every_job_s_ranks_are_done(tmp_path):
    """validate.jobs' end gate: a rank marks itself done and waits for all; a failed rank marks itself and leaves
    at once (nobody waits for it); a rank whose peers never come leaves at the gate's time bound, without error.
    A gate without an end folder (a single job) is no gate."""
    import threading

    from validate.ranks.gate import leave_at_end

    gate = {"dir": str(tmp_path / "start"), "end_dir": str(tmp_path / "end"), "ranks": 3, "job": 0,
            "timeout_s": 60.0, "end_timeout_s": 60.0}
    left = []
    waiting = threading.Thread(target=lambda: (leave_at_end(gate, 0, wait=True), left.append(0)))
    waiting.start()
    leave_at_end({**gate, "job": 1}, 0, wait=False)  # job 1's rank 0 failed: marked, gone
    time.sleep(0.1)
    assert left == [] and waiting.is_alive()  # job 0's rank 0 still waits for the third rank
    leave_at_end({**gate, "job": 1}, 1, wait=True)
    waiting.join(5.0)
    assert left == [0]
    assert sorted(p.name for p in (tmp_path / "end").iterdir()) == ["0-rank0", "1-rank0", "1-rank1"]
    started = time.monotonic()
    leave_at_end({**gate, "end_dir": str(tmp_path / "alone"), "end_timeout_s": 0.2}, 0, wait=True)
    assert time.monotonic() - started >= 0.2  # it waited out its bound: nobody else came
    leave_at_end({k: v for k, v in gate.items() if k != "end_dir"}, 0, wait=True)  # returns at once
