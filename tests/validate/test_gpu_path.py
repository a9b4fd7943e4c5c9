"""`simfog validate --backend nccl`: the clocks (host stamps and completions here; CUDA events where a GPU exists),
NCCL calibration of the validator from the run's own microbenchmarks, and what the NCCL path refuses. The GPU runs
themselves are skipped on machines without CUDA GPUs, saying so."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from simfog import nccl  # noqa: E402
from simfog.errors import ConfigError  # noqa: E402
from simfog.importers import import_file  # noqa: E402
from validate import nccl_calibration  # noqa: E402
from validate.ranks.timing import CudaClock, HostClock, clock_for, to_seconds  # noqa: E402
from validate.ranks.worker import rank_device  # noqa: E402
from validate.run import Options, check_experiment, simulated_experiment  # noqa: E402

from ..conftest import REF, make_experiment, make_trace  # noqa: E402

A100_LOGS = REF / "nccl-tests" / "echo-a100-azure"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
NO_GPU = f"needs a CUDA GPU (torch sees {GPUS}): the NCCL/CUDA path runs where one exists"


class _Work:
    """Stands in for a c10d Work: a future completed by the test."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


def test_host_clock_stamps_are_perf_counter_and_completions_come_from_the_future():
    clock = clock_for(torch.device("cpu"))
    assert isinstance(clock, HostClock) and clock.device.type == "cpu"
    before = time.perf_counter()
    s = clock.stamp()
    assert before <= clock.seconds(s) <= time.perf_counter()
    box = [float("nan"), float("nan")]
    work = _Work()
    clock.on_done(work, box, 1)
    assert math.isnan(box[1])                 # not complete yet
    work.future.set_result(None)
    assert box[1] >= s and math.isnan(box[0])
    first = box[1]
    clock.on_done(_Work(), box, 1)            # a stamp once set is kept (finish() may set it before the callback)
    assert box[1] == first
    assert clock.between(1.0, 1.25) == 0.25
    out = to_seconds(clock, [2.0, float("nan")])
    assert out[0] == 2.0 and math.isnan(out[1])


def test_device_of_a_rank():
    assert rank_device("gloo", 3) == torch.device("cpu")
    with pytest.raises(ConfigError, match="backend"):
        rank_device("mpi", 0)
    if GPUS == 0:
        with pytest.raises(ConfigError, match="without a CUDA GPU"):
            rank_device("nccl", 0)
        with pytest.raises(RuntimeError, match="CUDA"):
            CudaClock()


def test_nccl_tables_follow_the_release():
    # every release from 2.8 has its own tables now (simfog.nccl.releases), not one of two
    assert [nccl_calibration.tables_for(v) for v in ("2.8.4", "2.18.3", "2.19.3", "2.21.5", None, "x", "2.7.8")] == [
        "2.8.4", "2.18.3", "2.19.3", "2.21.5", "2.30", "2.30", "2.30"]


@pytest.fixture
def one_node():
    trace = make_trace([1e-3] * 4, [2e-3] * 4, [2**20] * 4)
    return make_experiment(trace, nodes=1, gpus_per_node=2, iterations=3)


def test_calibration_sizes_follow_the_backend():
    from validate.run import CALIBRATION_SIZES

    assert Options().sizes == CALIBRATION_SIZES
    nccl_sizes = Options(backend="nccl").sizes
    assert (nccl_sizes[0], nccl_sizes[-1], len(nccl_sizes)) == (8, 2**30, 28)   # nccl-tests' 8 B-1 GiB, x2
    assert Options(backend="nccl", calibration_sizes=(1000,)).sizes == (1000,)


def test_what_the_nccl_path_refuses(one_node):
    with pytest.raises(ConfigError, match="backend"):
        Options(backend="mpi")
    two_nodes = replace(one_node, cluster=replace(one_node.cluster, nodes=2))
    with pytest.raises(ConfigError, match="torchrun or slurm"):
        check_experiment(two_nodes, "replay", "nccl", "local")
    check_experiment(two_nodes, "replay", "nccl", "torchrun")   # several nodes through torchrun: allowed
    with pytest.raises(ConfigError, match="allreduce with --backend nccl"):
        check_experiment(one_node.with_comm(algorithm="neighbor"), "replay", "nccl", "local")


@pytest.mark.skipif(GPUS >= 2, reason="this machine has the GPUs: the refusal does not apply")
def test_validate_with_nccl_without_gpus_says_so_before_launching(one_node):
    from validate.run import run_group

    with pytest.raises(ConfigError, match="one CUDA GPU per rank"):
        run_group([one_node], Options(backend="nccl"))


def test_nccl_fit_of_microbenchmarks_drives_the_simulated_experiment(one_node):
    """The validator's NCCL microbenchmarks are nccl-tests-shaped measurements: fit the A100 1- and 2-node logs as
    they would be, then the simulated experiment runs NCCL's model on the fitted network."""
    logs = [import_file("nccl-tests", A100_LOGS / f"nccl_{n}.log") for n in (2, 8, 16)]
    net = replace(logs[0], measurements=tuple(m for t in logs for m in t.measurements),
                  extra={"software": {"nccl": "2.21.5", "gpu": "NVIDIA A100-SXM4-80GB"}})
    fitted = nccl_calibration.fit(net, "allreduce")
    assert fitted.network.version == "2.21.5" and fitted.network.gpu_arch == "ampere"  # the release's own tables
    res = fitted.residuals
    assert set(res.link_class) == {"nccl"} and len(res) == len(fitted.calibration.points)
    assert float(res.rel_error.abs().median()) < 0.15     # the fit itself is checked in tests/test_nccl_fit.py
    sim = simulated_experiment(one_node, fitted)
    assert sim.comm.collective == "nccl" and sim.network.nccl == fitted.network
    assert sim.cluster.intra.bandwidth_Bps == fitted.network.intra_bus_Bps
    # what the simulation costs a bucket is NCCL's choice on that network
    cost = sim.cost_model().allreduce(2**20)
    assert cost == pytest.approx(nccl.choose("allreduce", 2**20, 2, 1, fitted.network).time_s, rel=1e-9)
    assert "NCCL model" in fitted.report()


@pytest.mark.skipif(GPUS == 0, reason=NO_GPU)
def test_cuda_clock_maps_device_time_onto_perf_counter():
    clock = CudaClock(torch.device("cuda", 0))
    clock.start_iteration()
    a = clock.stamp()
    torch.cuda._sleep(10_000_000)  # a kernel that spins ~5-10 ms
    b = clock.stamp()
    host = time.perf_counter()
    clock.settle()
    assert clock.seconds(a) <= host + 1e-3             # queued at once, reached before the host waited
    assert clock.between(a, b) > 1e-3 and clock.seconds(b) > clock.seconds(a)


@pytest.mark.skipif(GPUS == 0, reason=NO_GPU)
@pytest.mark.parametrize("mode", ["replay", "model"])
def test_one_rank_validation_on_one_gpu(tmp_path, mode):
    """One rank on one GPU through the CLI with --backend nccl: DDP on the GPU, the NCCL calibration, CUDA clocks;
    replay waits on the host while the gradients live on the GPU (a CUDA stamp once reached the host's deadlines)."""
    import csv

    from simfog.cli import main
    from validate.collect.collect_model import collect_model

    collect_model("mlp", 256, iterations=3, warmup=1, device="cuda").save(tmp_path / "trace.json.gz")
    (tmp_path / "exp.toml").write_text(
        'seed = 3\niterations = 4\n[workload]\ntrace = "trace.json.gz"\ncompute = "replay"\n'
        '[cluster]\nnodes = 1\ngpus_per_node = 1\nnic_bandwidth = "100Gbit/s"\n[comm]\nmerge = "ddp"\n')
    out = tmp_path / "v.csv"
    main(["validate", str(tmp_path / "exp.toml"), "--loopback", "--backend", "nccl", "--mode", mode,
          "--csv", str(out)])
    (row,) = list(csv.DictReader(open(out, newline="")))
    assert row["error"] == "" and float(row["measured_iteration_s"]) > 0 and float(row["predicted_iteration_s"]) > 0


@pytest.mark.skipif(GPUS < 2, reason=NO_GPU.replace("a CUDA GPU", "2 CUDA GPUs"))
def test_small_validation_on_two_gpus(tmp_path):
    """2 ranks on one machine's GPUs, replay of a small trace, wfbp and ddp, through the CLI with --backend nccl."""
    import csv

    from simfog.cli import main

    trace = make_trace([3e-3] * 6, [6e-3] * 6, [2**20] * 6)
    trace.save(tmp_path / "trace.json")
    (tmp_path / "exp.toml").write_text(
        'seed = 3\niterations = 4\n[workload]\ntrace = "trace.json"\n'
        '[cluster]\nnodes = 1\ngpus_per_node = 2\nnic_bandwidth = "100Gbit/s"\n[comm]\nmerge = "wfbp"\n')
    out = tmp_path / "v.csv"
    assert main(["validate", str(tmp_path / "exp.toml"), "--merge", "wfbp,ddp", "--backend", "nccl",
                 "--csv", str(out)]) == 0
    rows = list(csv.DictReader(open(out, newline="")))
    assert [r["calibration"] for r in rows] == ["nccl allreduce"] * 2
    for r in rows:
        assert r["error"] == "" and r["buckets_match"] == "True" and float(r["measured_iteration_s"]) > 0
