"""validate.ranks.fsdp: simfog's prefetch depth mapped onto FSDP2's explicit prefetch lists, the replay model grouped
in the experiment's units, fully_shard applied per unit (one-rank process group), what cannot be run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simfog.errors import ConfigError
from simfog.simulation import new_simulation
from validate.ranks.fsdp import check_experiment, communication_matches, prefetch_lists, worker_fields

from ..conftest import make_experiment, make_trace


def test_prefetch_lists_by_hand():
    # k = 1: the root gathers units 0 and 1 before unit 0 waits; unit u prefetches u+1 (forward) and u-1 (backward,
    # FSDP2's own default)
    assert prefetch_lists(4, 1) == {"root_forward": [0, 1], "forward": [[1], [2], [3], []],
                                    "backward": [[], [0], [1], [2]]}
    # k = 2: windows of two
    assert prefetch_lists(4, 2) == {"root_forward": [0, 1, 2], "forward": [[1, 2], [2, 3], [3], []],
                                    "backward": [[], [0], [1, 0], [2, 1]]}
    # k = 0: nothing ahead; backward lists hold the unit itself, since an empty list means FSDP2's default prefetch
    assert prefetch_lists(3, 0) == {"root_forward": [], "forward": [[], [], []], "backward": [[0], [1], [2]]}
    with pytest.raises(ConfigError, match="prefetch"):
        prefetch_lists(3, -1)


def test_prefetch_windows_match_the_simulated_plan():
    """The all-gathers issued by the time unit u computes are those of simfog's plan: units up to u + k."""
    for k in (0, 1, 2, 3):
        lists = prefetch_lists(5, k)
        issued = set(lists["root_forward"])
        for u in range(5):
            issued |= {u, *lists["forward"][u]}  # its own unshard, then its prefetch list
            assert issued == set(range(min(5, u + k + 1)))


def _fsdp_experiment(**comm):
    trace = make_trace([1e-3] * 4, [2e-3] * 4, [1000, 0, 3000, 2000])
    exp = make_experiment(trace, nodes=2, gpus_per_node=1, collective="gloo_ring", algorithm="fsdp", **comm)
    return exp


def test_worker_fields_follow_the_simulated_units_and_plan():
    sim = new_simulation(_fsdp_experiment(fsdp_unit=(2, 2), reshard_after_forward=False, prefetch=2))
    f = worker_fields(sim)
    assert f["units"] == [[0, 1], [2, 3]] and f["unit_names"] == ["l0..l1", "l2..l3"]
    assert f["reshard_after_forward"] is False and f["prefetch"] == 2 and f["optimizer_shards"] == 2
    assert f["collectives"] == ["allgather.fwd.l0..l1", "allgather.fwd.l2..l3", "reduce_scatter.l2..l3",
                                "reduce_scatter.l0..l1"]
    cfg = {**f, "iterations": 1}
    rec = {"iterations": [{"launch_order": [0, 1, 2, 3]}]}
    assert communication_matches(cfg, [rec, rec])
    assert not communication_matches(cfg, [rec, {"iterations": [{"launch_order": [0, 1, 3, 2]}]}])


def test_what_fsdp_cannot_run_is_refused():
    exp = _fsdp_experiment()
    check_experiment(exp, "replay", "gloo")
    check_experiment(exp, "model", "gloo")  # FSDP2 on the real model
    with pytest.raises(ConfigError, match="replay or model"):
        check_experiment(exp, "simulated", "gloo")
    with pytest.raises(ConfigError, match="backend"):
        check_experiment(exp, "replay", "nccl")
    with pytest.raises(ConfigError, match="param_dtype"):
        check_experiment(replace(exp, comm=replace(exp.comm, param_dtype="bfloat16")), "replay", "gloo")
    with pytest.raises(ConfigError, match="at least 2"):
        check_experiment(replace(exp, cluster=replace(exp.cluster, nodes=1)), "replay", "gloo")


def test_replay_units_group_the_layers_and_keep_gradients():
    torch = pytest.importorskip("torch")
    from validate.ranks.replay import ReplayModel, ReplayUnit

    trace = make_trace([1e-4] * 4, [1e-4] * 4, [10, 0, 30, 20])
    model = ReplayModel(trace, units=[(0, 1), (2,), (3,)], spin_s=0.0)
    assert [type(u) for u in model.units] == [ReplayUnit] * 3 and [u.index for u in model.units] == [(0, 1), (2,),
                                                                                                      (3,)]
    # parameters registered once, under the units
    assert [n for n, _ in model.named_parameters()] == ["units.0.layers.0.params.0", "units.1.layers.0.params.0",
                                                        "units.2.layers.0.params.0"]
    assert list(model.named_tensors()) == ["l0.weight", "l2.weight", "l3.weight"]
    model.set_iteration([1e-4] * 4, [1e-4] * 4)
    model(torch.zeros(1, requires_grad=True)).sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    with pytest.raises(ConfigError, match="units"):
        ReplayModel(trace, units=[(0,), (2, 3)])


def test_blocked_time_moves_the_pass_deadlines():
    pytest.importorskip("torch")
    from validate.ranks.replay import ReplayModel

    model = ReplayModel(make_trace([1e-3] * 2, [1e-3] * 2, [10, 10]), spin_s=0.0)
    model.set_iteration([1e-3] * 2, [2e-3] * 2, start_s=100.0)
    model.blocked(0.5)  # forward: an all-gather waited for before a layer
    assert model.clock.fwd_origin == 100.5
    model.start_backward(200.0)
    model.blocked(0.25)  # backward now
    assert (model.clock.fwd_origin, model.clock.bwd_origin) == (100.5, 200.25)


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group for the test (no peers needed), destroyed after it."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fully_shard_per_unit_with_the_prefetch_lists(one_rank_group):
    """On a one-rank gloo group (no peers needed): one FSDP2 state per unit and the root, the lists set as mapped."""
    torch = pytest.importorskip("torch")

    from validate.ranks import fsdp
    from validate.ranks.replay import ReplayModel

    sim = new_simulation(_fsdp_experiment(fsdp_unit=(1, 1, 2), prefetch=1))
    cfg = worker_fields(sim)
    model = ReplayModel(sim.experiment.workload.trace, units=cfg["units"], spin_s=0.0)
    recorder = fsdp.make(model, cfg)
    from torch.distributed.fsdp import FSDPModule

    assert all(isinstance(m, FSDPModule) for m in (model, *model.units))
    states = [u._get_fsdp_state() for u in model.units]
    root = model._get_fsdp_state()
    assert root._states_to_forward_prefetch == states[:2]
    assert [s._states_to_forward_prefetch for s in states] == [[states[1]], [states[2]], []]
    assert [s._states_to_backward_prefetch for s in states] == [[], [states[0]], [states[1]]]
    # unit 1 (layer 1) has no parameters: no param group, hence no collectives
    assert [len(s._fsdp_param_groups) for s in states] == [1, 0, 1]
    assert all(g.unshard_async_op for s in states for g in s._fsdp_param_groups)
    model.set_iteration([1e-4] * 4, [1e-4] * 4)
    recorder.start_iteration()
    loss = model(torch.zeros(1, requires_grad=True)).sum()
    recorder.backward_started()
    loss.backward()
    recorder.finish()
    memory = fsdp.MemoryProfile(model)
    assert memory.stop()["resident_B"] == 6000 * 4  # one rank: the whole model is its shard


@pytest.mark.parametrize("comm", [{"fsdp_unit": (1, 1, 2), "prefetch": 1},
                                  {"fsdp_unit": "layer", "prefetch": 1, "reshard_after_forward": False},
                                  {"fsdp_unit": "layer", "prefetch": 2}])
def test_memory_walk_matches_fsdp2s_own_allocations(comm, one_rank_group):
    """FSDP2 itself on a one-rank gloo group, steady state: the allocator's peak of an iteration (torch.profiler's
    memory events, validate.ranks.fsdp.MemoryProfile) equals simfog's walk of FSDP2's allocations to the byte, but
    for the one-element input and loss (12 B). One rank: FSDP2 gathers nothing (the walk's all-gather outputs are 0
    there too); the 2-rank emulated test covers the all-gathers."""
    torch = pytest.importorskip("torch")

    from validate.ranks import fsdp
    from validate.ranks.replay import ReplayModel

    trace = make_trace([1e-3] * 4, [2e-3] * 4, [100_000, 0, 300_000, 200_000])
    sim = new_simulation(make_experiment(trace, nodes=1, gpus_per_node=1, collective="gloo_ring",
                                         algorithm="fsdp", **comm))
    cfg = worker_fields(sim)
    model = ReplayModel(sim.experiment.workload.trace, units=cfg["units"], spin_s=0.0)
    recorder = fsdp.make(model, cfg)
    for it in range(3):  # the profiled third: FSDP2's lazy initialisation is done by then
        memory = fsdp.MemoryProfile(model) if it == 2 else None
        model.set_iteration([1e-4] * 4, [1e-4] * 4)
        recorder.start_iteration()
        loss = model(torch.zeros(1, requires_grad=True)).sum()
        recorder.backward_started()
        loss.backward()
        recorder.finish()
        for p in model.parameters():
            p.grad = None
    measured = memory.stop()["framework_peak_B"]
    walk = sim.algorithm.memory(activations=False)
    assert measured - (walk.parameters_B + walk.gradients_B + walk.buffers_B) == 12


# ---- zero2 (validate.ranks.zero) ----

def test_zero2_worker_fields_follow_the_simulated_buckets():
    from validate.ranks.zero import check_experiment as check_zero
    from validate.ranks.zero import worker_fields as zero_fields

    trace = make_trace([1e-3] * 4, [2e-3] * 4, [1000, 0, 3000, 2000])
    exp = make_experiment(trace, nodes=2, gpus_per_node=1, collective="gloo_ring", algorithm="zero2",
                          reduce_bucket_size=4000, allgather_bucket_size=3000)
    f = zero_fields(new_simulation(exp))
    # ready order l3, l2, l0: l3 + l2 = 5000 > 4000 elements, so l3 alone, then l2 + l0 (4000)
    assert f["zero_buckets"] == [["l3.weight"], ["l2.weight", "l0.weight"]]
    assert f["collectives"] == ["reduce.bucket0", "reduce.bucket1", "allgather.params0", "allgather.params1"]
    assert (f["overlap"], f["allgather_shards"], f["optimizer_shards"]) == (False, 2, 2)
    check_zero(exp, "replay", "gloo")
    with pytest.raises(ConfigError, match="zero_reduce"):
        check_zero(replace(exp, comm=replace(exp.comm, zero_reduce="reduce")), "replay", "gloo")
    check_zero(exp, "model", "gloo")  # a real optimizer over the rank's partition
    with pytest.raises(ConfigError, match="replay or model"):
        check_zero(exp, "simulated", "gloo")


def test_zero2_model_mode_steps_the_partition_like_sgd_on_the_mean(one_rank_group):
    """Model mode on a one-rank gloo group: the rank owns the whole partition, so after one iteration every
    parameter must equal what torch's SGD (momentum 0.9, lr 0.01) makes of the same gradients: checks the flat
    offsets, the zero padding of the all-gather shards and the copy back into the model."""
    torch = pytest.importorskip("torch")

    from validate.ranks.zero import Zero2
    from validate.ranks.zero import worker_fields as zero_fields

    trace = make_trace([1e-3] * 4, [2e-3] * 4, [1000, 0, 3000, 2000])
    exp = make_experiment(trace, nodes=1, gpus_per_node=1, collective="gloo_ring", algorithm="zero2",
                          reduce_bucket_size=4000, allgather_bucket_size=2500)
    cfg = {**zero_fields(new_simulation(exp)), "overlap": True}
    gen = torch.Generator().manual_seed(0)
    params = {t.name: torch.nn.Parameter(torch.randn(t.elements, generator=gen)) for t in trace.ready_tensors()}
    reference = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
    zero = Zero2(params, cfg, 0, 1, train=True)
    sgd = torch.optim.SGD(reference.values(), lr=0.01, momentum=0.9)
    for _ in range(2):  # the second step uses the momentum
        zero.start_iteration()
        grads = {n: torch.randn(p.numel(), generator=gen) for n, p in params.items()}
        for n in cfg["zero_buckets"][0] + cfg["zero_buckets"][1]:  # backward hands them out in ready order
            params[n].grad = grads[n].clone()
        for k in range(len(cfg["zero_buckets"]) - 1):  # what the post-accumulate hooks do in backward
            zero._reduce(k)
        zero.finish()
        zero.step()
        zero.after_optimizer()
        for n, p in reference.items():
            p.grad = grads[n].clone()
        sgd.step()
    assert cfg["allgather_shards"] == 2  # 6000 elements in shards of 2500 (+ padding)
    for n in params:
        assert torch.allclose(params[n].detach(), reference[n].detach(), rtol=0, atol=1e-6), n
    zero.close()


class _FakeWork:
    """A collective that completes when the test says so."""

    def __init__(self, log, name):
        import threading

        self.finished, self.log, self.name = threading.Event(), log, name

    def wait(self):
        self.finished.wait(5)
        self.log.append(("done", self.name))
        return True


def test_collectives_on_cpus_run_one_at_a_time_in_issue_order():
    """gloo would run two of a group's collectives at once; the recorder issues each after the one before completed
    (NCCL's one-at-a-time per communicator, what simfog models), stamps its real start and passes errors on."""
    pytest.importorskip("torch")
    import time

    from validate.ranks.fsdp_comm import FSDPComm

    log, works = [], {}

    def start(name):
        def go():
            log.append(("start", name))
            works[name] = _FakeWork(log, name)
            return works[name]
        return go

    recorder = FSDPComm(["a", "b", "c"])
    assert recorder.in_order
    first, second = recorder.issue("a", start("a")), recorder.issue("b", start("b"))
    time.sleep(0.05)
    assert log == [("start", "a")] and not first.is_completed()   # b waits for a
    works["a"].finished.set()
    first.wait()
    time.sleep(0.05)
    assert log == [("start", "a"), ("done", "a"), ("start", "b")]
    works["b"].finished.set()
    second.wait()
    assert recorder.launch_order == [0, 1] and recorder.done_s[0] <= recorder.launch_s[1] <= recorder.done_s[1]

    def broken():
        raise RuntimeError("peer gone")

    failed = recorder.issue("c", broken)
    with pytest.raises(RuntimeError, match="peer gone"):
        failed.wait()
