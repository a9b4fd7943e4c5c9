"""The inputs issue 22's fuzzing found (3,266 inputs on d690bb7): tracebacks, exit 0 with nonsense, hangs, a sweep
row lost on resume. Each gives one clean line naming its file, field or option now (or, from Python, a
simfog.ConfigError naming the keyword), writes nothing, and ends in seconds; every test here failed before.

CLI cases run in-process through bench/fuzz.py's run_case (exit 2, one `simfog: error:` line that names the culprit,
no file written, a per-input alarm that turns a hang into a failure).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re

import pytest

import simfog
from simfog import cli

from .conftest import REPO
from .test_fuzz_cli import fuzz

MLP = REPO / "traces" / "mlp-cpu-b1024.json.gz"
BERT = REPO / "traces" / "bert-base-cpu-b8.json.gz"


def _check(d, argv, needle, timeout=60):
    case = fuzz.Case("regression", argv, (needle,))
    outcome = fuzz.run_case(case, d, timeout=timeout)
    assert outcome.kind == "clean", f"simfog {' '.join(argv)} -> {outcome.kind}: {outcome.detail}\n{outcome.stderr}"
    return outcome.stderr


def _trace(d, change=None, src=MLP, name="t.json") -> str:
    t = json.loads(gzip.decompress(src.read_bytes()))
    if change:
        change(t)
    (d / name).write_text(json.dumps(t))
    return name


def _exp(d, *, trace="t.json", nodes=2, gpus=2, cluster="", comm="", name="e.toml") -> str:
    (d / name).write_text(f'seed = 1\niterations = 2\n[workload]\ntrace = {json.dumps(trace)}\ncompute = "mean"\n'
                          f'[cluster]\nnodes = {nodes}\ngpus_per_node = {gpus}\n'
                          + (cluster or 'nic_bandwidth = "25Gbit/s"\n') + f"[comm]\n{comm}")
    return name


def _zero_compute(t):
    for layer in t["layers"]:
        layer["forward_s"] = [0.0] * len(layer["forward_s"])
        layer["backward_s"] = [0.0] * len(layer["backward_s"])


# ---- tracebacks ----

def test_a_grad_ready_order_entry_that_is_an_object(tmp_path):
    _trace(tmp_path, lambda t: t["grad_ready_order"].__setitem__(0, {"a": 1}))
    _check(tmp_path, ["simulate", _exp(tmp_path)], "grad_ready_order[0]")


@pytest.mark.parametrize("how", ["symlink loop", "NUL byte"])
def test_a_trace_path_that_cannot_be_resolved(tmp_path, how):
    if how == "symlink loop":
        os.symlink("loop", tmp_path / "loop")
        name = "loop"
    else:
        name = "a\0b"
    err = _check(tmp_path, ["simulate", _exp(tmp_path, trace=name)], "workload.trace")
    assert "e.toml" in err


def test_a_catalogue_network_path_in_a_symlink_loop(tmp_path):
    _trace(tmp_path)
    os.symlink("loop", tmp_path / "loop")
    (tmp_path / "cat.toml").write_text('currency = "USD"\n[[option]]\nname = "x"\ngpus_per_node = 2\nmax_nodes = 2\n'
                                       'price_per_gpu_hour = 1.0\nnetwork = "loop"\n')
    _check(tmp_path, ["plan", "t.json", "--catalogue", "cat.toml", "--target-samples-per-s", "1"], "network")


@pytest.mark.parametrize("merge", ["mgwfbp", "ddp"])
def test_a_bandwidth_of_1e_300_bytes_per_second(tmp_path, merge):
    _trace(tmp_path)
    exp = _exp(tmp_path, cluster='nic_bandwidth = "25Gbit/s"\nintra_bandwidth = "1e-300B/s"\n',
               comm=f'merge = "{merge}"\n')
    err = _check(tmp_path, ["simulate", exp], "cluster.intra_bandwidth")
    assert "at least 1e-3 B/s" in err


def test_a_kineto_trace_with_every_event_twice(tmp_path, ref_dir):
    data = json.loads(gzip.decompress((ref_dir / "gloo-ddp-cpu" / "rank0.json.gz").read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] for _ in range(2)]
    (tmp_path / "k.json").write_text(json.dumps(data))
    err = _check(tmp_path, ["import", "kineto", "k.json", "-o", "o.json"], "k.json")
    assert "listed twice" in err


def test_a_kineto_trace_with_profiler_steps_twice(tmp_path):
    data = json.loads(gzip.decompress((REPO / "traces" / "resnet50-h200-ddp1-kineto.json.gz").read_bytes()))
    data["traceEvents"] = [e for e in data["traceEvents"] for _ in range(2)]
    (tmp_path / "k.json").write_text(json.dumps(data))
    _check(tmp_path, ["import", "kineto", "k.json", "-o", "o.json"], "ProfilerStep#")


@pytest.mark.parametrize("argv, needle", [
    (["--epoch-samples", "inf", "--epoch-time", "2h"], "--epoch-samples"),
    (["--epoch-samples", "inf", "--target-samples-per-s", "1"], "--epoch-samples"),
    (["--target-samples-per-s", "inf"], "--target-samples-per-s"),
])
def test_plan_with_an_infinite_epoch_or_target_writes_nothing(tmp_path, argv, needle):
    _trace(tmp_path)
    _check(tmp_path, ["plan", "t.json", *argv, "-o", "p"], needle)  # run_case: no p.csv left behind


def test_plan_writes_neither_file_when_the_figure_fails(tmp_path, monkeypatch):
    from simfog import plot

    _trace(tmp_path)

    def broken(*a, **k):
        raise simfog.ConfigError("figure", "x", "a figure that draws")

    monkeypatch.setattr(plot, "plan_figure", broken)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan", "t.json", "--target-samples-per-s", "1", "-o", "p"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize("nodes, gpus", [(1, 1), (2, 2)])
def test_a_trace_whose_compute_is_all_zero(tmp_path, nodes, gpus):
    # one rank: a division by zero; several: "scaling efficiency 0.0 %" and exit 0
    _trace(tmp_path, _zero_compute)
    err = _check(tmp_path, ["simulate", _exp(tmp_path, nodes=nodes, gpus=gpus)], "t.json")
    assert "forward and backward" in err


def test_a_trace_whose_compute_is_subnormal(tmp_path):
    def tiny(t):
        _zero_compute(t)
        t["layers"][0]["forward_s"] = [5e-324] * len(t["layers"][0]["forward_s"])

    _trace(tmp_path, tiny)
    _check(tmp_path, ["simulate", _exp(tmp_path, nodes=1, gpus=1)], "t.json")


@pytest.fixture
def exp_path(tmp_path):
    _trace(tmp_path)
    return tmp_path / _exp(tmp_path)


@pytest.mark.parametrize("kwargs, field", [
    ({"merge": ["ddp", 3]}, "merge"),
    ({"merge": ""}, "merge"),
    ({"merge": []}, "merge"),
    ({"collective": [None]}, "collective"),
    ({"threshold": [math.nan]}, "threshold"),
    ({"threshold": [math.inf]}, "threshold"),
    ({"threshold": [-1]}, "threshold"),
    ({"threshold": [10**400]}, "threshold"),
    ({"ranks": []}, "ranks"),
    ({"jobs": "2"}, "jobs"),
    ({"jobs": 0}, "jobs"),
    ({"jobs": 1.5}, "jobs"),
    ({"progress": "yes"}, "progress"),
    ({"output": 5}, "output"),
    ({"output": "."}, "output"),
    ({"output": "t.json/sub/s.csv"}, "output"),   # its folder is a file
    ({"output": "a\0b.csv"}, "output"),
])
def test_the_python_sweep_checks_its_arguments_as_the_cli_does(exp_path, monkeypatch, kwargs, field):
    monkeypatch.chdir(exp_path.parent)
    before = sorted(p.name for p in exp_path.parent.iterdir())
    with pytest.raises(simfog.ConfigError) as e:
        simfog.sweep(exp_path, **kwargs)
    assert e.value.field == field and "\n" not in str(e.value)
    assert sorted(p.name for p in exp_path.parent.iterdir()) == before


def test_the_python_sweep_still_takes_sizes_and_numbers_of_bytes(exp_path):
    df = simfog.sweep(exp_path, ranks=[2, 4], merge="ddp", threshold=["1MiB", 2**20], jobs=1)
    assert len(df) == 4 and (df.error == "").all() and set(df.threshold_bytes) == {2.0**20}


# ---- silent nonsense ----

def _catalogue(d, **changes) -> str:
    import tomllib

    c = tomllib.loads((REPO / "simfog" / "data" / "catalogue.toml").read_text())
    c["option"][0].update(changes)
    (d / "cat.toml").write_text(fuzz.dump_toml(c))
    return "cat.toml"


@pytest.mark.parametrize("changes, needle", [
    ({"price_per_gpu_hour": math.inf}, "price_per_gpu_hour"),
    ({"merges": []}, "merges"),
    ({"collectives": []}, "collectives"),
    ({"oversubscription": math.inf}, "oversubscription"),
])
def test_a_catalogue_option_that_cannot_be_priced_or_planned(tmp_path, changes, needle):
    _trace(tmp_path)
    cat = _catalogue(tmp_path, **changes)
    _check(tmp_path, ["plan", "t.json", "--catalogue", cat, "--target-samples-per-s", "1"], needle)


def _network(d, inter="10GB/s", intra="100GB/s") -> str:
    (d / "net.toml").write_text(f'[nccl]\nintra_bus_bandwidth = "{intra}"\ninter_bus_bandwidth = "{inter}"\n')
    return "net.toml"


def test_a_network_file_with_a_bandwidth_of_1e_300(tmp_path):
    _trace(tmp_path)
    _network(tmp_path, inter="1e-300B/s")
    _check(tmp_path, ["simulate", _exp(tmp_path, cluster='network = "net.toml"\n')], "nccl.inter_bus_bandwidth")


def test_a_run_longer_than_1e9_seconds_is_refused_naming_the_link(tmp_path):
    # 2e-3 B/s is a bandwidth the file may say, but 918.5 KiB of gradients take 4.7e8 s over it, 1.6e9 s a run
    _trace(tmp_path)
    _network(tmp_path, inter="2e-3B/s")
    err = _check(tmp_path, ["simulate", _exp(tmp_path, cluster='network = "net.toml"\n')], "nccl.inter_bus_bandwidth")
    assert "the run would last 1.61e+09 s, more than 1e9 s" in err


def test_an_experiment_link_so_slow_the_run_exceeds_1e9_seconds(tmp_path):
    _trace(tmp_path)
    exp = _exp(tmp_path, cluster='nic_bandwidth = "25Gbit/s"\nintra_bandwidth = "1e-3B/s"\n', comm='merge = "mgwfbp"\n')
    err = _check(tmp_path, ["simulate", exp], "cluster.intra_bandwidth")
    assert "more than 1e9 s" in err


def test_a_latency_of_1e9_seconds_makes_a_run_too_long(tmp_path):
    _trace(tmp_path)
    exp = _exp(tmp_path, cluster='nic_bandwidth = "25Gbit/s"\nnic_latency = "1e9s"\n')
    _check(tmp_path, ["simulate", exp], "nic_latency")


def test_a_sweep_point_too_long_is_an_error_row_not_a_number(tmp_path):
    _trace(tmp_path)
    _network(tmp_path, inter="2e-3B/s")
    df = simfog.sweep(tmp_path / _exp(tmp_path, cluster='network = "net.toml"\n'), ranks=[1, 4])
    assert df.error.tolist()[0] == "" and "more than 1e9 s" in df.error.tolist()[1]
    assert math.isnan(df.iteration_time_s[1])


@pytest.mark.parametrize("nodes", ["99999999999999999999", "1000001"])
def test_collective_with_more_nodes_than_a_simulation_holds(tmp_path, nodes):
    _check(tmp_path, ["collective", "allreduce", "--network", _network(tmp_path), "--nodes", nodes,
                      "--gpus-per-node", "1", "--sizes", "1MiB"], "--nodes")


def test_collective_on_a_network_too_slow_for_any_run(tmp_path):
    _check(tmp_path, ["collective", "allreduce", "--network", _network(tmp_path, inter="2e-3B/s"), "--nodes", "2",
                      "--gpus-per-node", "2", "--sizes", "8MiB"], "nccl.inter_bus_bandwidth")


def _zero_times(src, dst, pattern):
    """`src` with every time (the columns `pattern` matches in a measurement row) printed as 0.00."""
    lines = []
    for line in src.read_text().splitlines():
        lines.append(pattern(line))
    dst.write_text("\n".join(lines) + "\n")


def test_an_nccl_tests_log_whose_times_are_all_zero(tmp_path, ref_dir):
    def zero(line):
        p = line.split()
        if len(p) >= 12 and p[0].isdigit() and p[2] == "float":
            times = [i for i, x in enumerate(p) if re.fullmatch(r"\d+\.\d\d", x)]
            p[times[0]] = p[times[3]] = "0.00"  # out-of-place and in-place time (us)
            return "  ".join(p)
        return line

    _zero_times(ref_dir / "nccl-tests" / "echo-a100-azure" / "nccl_8.log", tmp_path / "n.log", zero)
    err = _check(tmp_path, ["import", "nccl-tests", "n.log", "-o", "o.json"], "n.log")
    assert "time_s" in err


def test_an_osu_log_whose_times_are_all_zero(tmp_path, ref_dir):
    _zero_times(ref_dir / "mgwfbp-googlenet" / "allreduce2.log", tmp_path / "x.log",
                lambda line: re.sub(r"^(\d+,\d+\s+)[\d.]+$", r"\g<1>0.00", line))
    assert "0.00" in (tmp_path / "x.log").read_text()
    _check(tmp_path, ["import", "osu", "x.log", "-o", "o.json"], "time_s")


def test_an_unknown_transport_is_refused(tmp_path):
    (tmp_path / "x.log").write_text("# OSU MPI Allreduce Latency Test\n# Size       Avg Latency(us)\n4 1.0\n8 2.0\n")
    _check(tmp_path, ["import", "osu", "x.log", "-s", "ranks=2", "-s", "transport=bogus", "-o", "o.json"], "transport")


@pytest.mark.parametrize("change, needle", [
    (lambda t: t["measurements"][0].update(bogus=1), "measurements[0].bogus"),
    (lambda t: t["measurements"][0].update(tim_s=[1.0]), "measurements[0].tim_s"),
    (lambda t: t.update(backend="ncl"), "backend"),
    (lambda t: t.update(transport="carrier pigeon"), "transport"),
])
def test_calibrate_refuses_unknown_measurement_keys_and_backends(tmp_path, change, needle):
    t = json.loads(gzip.decompress((REPO / "traces" / "net-gloo-loopback.json.gz").read_bytes()))
    change(t)
    (tmp_path / "n.json").write_text(json.dumps(t))
    _check(tmp_path, ["calibrate", "n.json"], needle)


@pytest.mark.parametrize("factor", [1e-300, 1e300])
def test_a_compute_slowdown_factor_out_of_range(tmp_path, factor):
    # 1e-300 on one rank: a 1e-293 s iteration and a 300-digit throughput, exit 0
    _trace(tmp_path)
    (tmp_path / "e.toml").write_text(f'seed = 1\niterations = 2\n[workload]\ntrace = "t.json"\ncompute = "mean"\n'
                                     f'[cluster]\nnodes = 1\nnic_bandwidth = "25Gbit/s"\n'
                                     f'[heterogeneity]\nnode_slowdown = {{ "0" = {factor!r} }}\n')
    _check(tmp_path, ["simulate", "e.toml"], "heterogeneity.node_slowdown.0")


# ---- hangs ----

@pytest.mark.parametrize("comm, needle", [
    ("streams = 9223372036854775807\n", "comm.streams"),
    ("streams = 65\n", "comm.streams"),
    ('collective = "ps"\nps_servers = 9223372036854775807\n', "comm.ps_servers"),
])
def test_counts_without_an_upper_bound(tmp_path, comm, needle):
    _trace(tmp_path)
    _check(tmp_path, ["simulate", _exp(tmp_path, comm=comm)], needle, timeout=30)


@pytest.mark.parametrize("algorithm, option, value", [
    ("allreduce", "--points", "1000000000"), ("allreduce", "--refine", "1001"),
    ("fsdp", "--sizes", "1000000000"), ("fsdp", "--max-prefetch", "17"),
])
def test_tune_searches_a_bounded_number_of_points(tmp_path, algorithm, option, value):
    _trace(tmp_path)  # 10**9 points: 10**9 simulations
    exp = _exp(tmp_path, comm=f'algorithm = "{algorithm}"\n')
    _check(tmp_path, ["tune", exp, option, value, "-o", "tn"], option, timeout=30)


@pytest.mark.parametrize("src, algorithm", [(MLP, "zero1"), (BERT, "zero2")])
def test_an_allgather_bucket_of_one_element(tmp_path, src, algorithm):
    # 235,146 all-gathers a step on the MLP took 27 s; BERT-base's 1.1e8 ran past 60 s and 6.3 GB
    _trace(tmp_path, src=src)
    err = _check(tmp_path, ["simulate", _exp(tmp_path, comm=f'algorithm = "{algorithm}"\nallgather_bucket_size = 1\n')],
                 "comm.allgather_bucket_size", timeout=30)
    assert "at most 10,000" in err


def test_the_least_allgather_bucket_the_message_names_is_accepted(tmp_path, monkeypatch, capsys):
    _trace(tmp_path)  # 235,146 parameters: 24 elements gives 9,797 shards, 23 gives 10,223
    monkeypatch.chdir(tmp_path)
    for size, rc in ((23, 2), (24, 0)):
        exp = _exp(tmp_path, comm=f'algorithm = "zero1"\nallgather_bucket_size = {size}\n')
        assert cli.main(["simulate", exp]) == rc
    assert "at least 24 elements" in capsys.readouterr().err


# ---- sweep resume ----

def test_a_sweep_row_torn_between_cr_and_lf_is_recomputed(tmp_path, monkeypatch, capsys):
    _trace(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", _exp(tmp_path), "--ranks", "1,2,4", "--jobs", "1", "--no-progress", "-o", "s.csv"]
    assert cli.main(argv) == 0
    whole = (tmp_path / "s.csv").read_bytes()
    assert whole.endswith(b"\r\n")
    (tmp_path / "s.csv").write_bytes(whole[:-1])  # killed after the "\r" of the last row
    assert cli.main(argv) == 0
    assert (tmp_path / "s.csv").read_bytes() == whole
    capsys.readouterr()


def test_mgwfbp_line_fit_with_a_near_subnormal_beta_does_not_break_the_solver():
    # Found by hypothesis (test_tune): beta = 2.2e-313 s/B made M/T overflow and numpy's SVD fail to converge.
    from simfog.merge import linear_cost

    a, b = linear_cost(lambda m: m * 2.2250738585e-313, 4.0, 100_000.0)
    assert a >= 0 and b >= 0 and a + b * 100_000 <= 1e-300
    assert linear_cost(lambda m: 1e-5 + m * 1e-9, 4.0, 1e8) == pytest.approx((1e-5, 1e-9), rel=1e-9)
