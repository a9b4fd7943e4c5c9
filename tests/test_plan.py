"""Capacity planning on cases computed by hand, and catalogue errors that name the file and the field."""

from __future__ import annotations

import csv
import math

import pytest

from simfog import cli
from simfog.commands.plan import DEFAULT_CATALOGUE
from simfog.errors import ConfigError, Infeasible
from simfog.plan import ClusterOption, load_catalogue, plan, workload_experiment

from .conftest import make_trace

# One iteration of one GPU: 0.05 s forward + 0.05 s backward, batch 8: 80 samples/s per GPU.
PER_GPU = 80.0

CATALOGUE = """
currency = "EUR"
note = "test prices"

[[option]]
name = "cheap"
gpus_per_node = 8
max_nodes = {cheap_nodes}
intra_bandwidth = "1000TB/s"
nic_bandwidth = "1000TB/s"
price_per_gpu_hour = 1.0
collectives = ["ring"]
merges = ["ddp", "wfbp"]

[[option]]
name = "dear"
gpus_per_node = 8
max_nodes = 4
intra_bandwidth = "1000TB/s"
nic_bandwidth = "1000TB/s"
price_per_gpu_hour = 3.0
collectives = ["ring", "tree"]
"""


@pytest.fixture
def files(tmp_path):
    make_trace([0.02, 0.03], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")

    def write(cheap_nodes=4, text=None):
        path = tmp_path / "cat.toml"
        path.write_text(text if text is not None else CATALOGUE.format(cheap_nodes=cheap_nodes))
        return tmp_path / "t.json", path
    return write


def smallest_count(target: float, per_node: int = 8) -> int:
    """By hand: the fewest GPUs at PER_GPU each reaching `target`, any count up to one node, whole nodes above."""
    n = math.ceil(target / PER_GPU)
    return n if n <= per_node else per_node * math.ceil(n / per_node)


@pytest.mark.parametrize("target, gpus", [(70, 1), (100, 2), (500, 7), (1900, 24), (2000, 32)])
def test_free_network_needs_the_smallest_count_reaching_the_target(files, target, gpus):
    trace, cat = files()
    assert gpus == smallest_count(target)
    r = plan(workload_experiment(trace), load_catalogue(cat), target_samples_per_s=target)
    b = r.best
    assert (b["option"], b["gpus"]) == ("cheap", gpus)
    assert b["cost_per_hour"] == gpus * 1.0
    assert b["scaling_efficiency"] == pytest.approx(1.0, abs=1e-6)  # the network is (almost) free
    assert b["samples_per_s"] == pytest.approx(gpus * PER_GPU, rel=1e-6)
    # Every series doubles until a count meets the target, then tries the counts in between, smallest first,
    # and stops at the first that meets it.
    series = r.candidates[(r.candidates.option == "cheap") & (r.candidates["merge"] == "ddp")]
    rungs = ClusterOption("cheap", 8, 4, None, None, 1.0).gpu_counts()  # 1, 2, 4, 8, 16, 32
    ladder = rungs[:next(i for i, n in enumerate(rungs) if n >= gpus) + 1]
    below = ladder[-2] if len(ladder) > 1 else 0
    between = [n for n in range(below + 1, min(gpus + 1, ladder[-1])) if n <= 8 or n % 8 == 0]
    assert list(series.gpus) == ladder + between
    assert r.currency == "EUR"


def test_96_gpus_are_found_where_doubling_gives_128(files):
    trace, cat = files(cheap_nodes=16)
    target = 96 * PER_GPU - 1  # 95 GPUs' worth and a bit: 12 nodes of 8
    r = plan(workload_experiment(trace), load_catalogue(cat), target_samples_per_s=target)
    assert (r.best["option"], r.best["gpus"], r.best["nodes"]) == ("cheap", 96, 12)
    tried = r.candidates[(r.candidates.option == "cheap") & (r.candidates["merge"] == "ddp")]
    assert 128 in set(tried.gpus) and not tried[tried.gpus == 88].meets_target.any()  # 88 is one node short


def test_epoch_costs_and_ranking(files):
    trace, cat = files()
    epoch = 640 * 3600  # one hour at 8 GPUs x 80 samples/s
    r = plan(workload_experiment(trace), load_catalogue(cat), target_samples_per_s=600, epoch_samples=epoch)
    assert r.best["gpus"] == 8
    assert r.best["epoch_time_s"] == pytest.approx(3600, rel=1e-6)
    assert r.best["cost_per_epoch"] == pytest.approx(8.0, rel=1e-6)
    ok = r.feasible()
    assert list(ok.cost_per_epoch) == sorted(ok.cost_per_epoch)
    # cheap x {ddp, wfbp} at 8 GPUs = 8 EUR per epoch; dear x {ring, tree} x ddp at 8 GPUs = 24 EUR.
    assert sorted(zip(ok.option, ok.cost_per_epoch.round(6), strict=True)) == [("cheap", 8.0), ("cheap", 8.0),
                                                                  ("dear", 24.0), ("dear", 24.0)]


def test_cheaper_option_that_cannot_reach_the_target_loses(files):
    trace, cat = files(cheap_nodes=1)  # cheap: at most 8 GPUs = 640 samples/s
    r = plan(workload_experiment(trace), load_catalogue(cat), target_samples_per_s=1000)
    assert (r.best["option"], r.best["gpus"], r.best["cost_per_hour"]) == ("dear", 16, 48.0)


def test_unreachable_target_says_what_the_best_reachable_was(files):
    trace, cat = files()
    with pytest.raises(Infeasible) as e:
        plan(workload_experiment(trace), load_catalogue(cat), target_samples_per_s=1e6)
    msg = str(e.value)
    # The most is 32 GPUs x 80 samples/s.
    assert "1,000,000.0 samples/s" in msg and "best reachable is 2,560.0 samples/s" in msg and "32 GPUs" in msg
    assert str(cat) in msg
    assert len(e.value.result.candidates) == 2 * 6 + 2 * 6  # every series ran to 32 GPUs (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize("old, new, field", [
    ('currency = "EUR"', "", "currency"),
    ('nic_bandwidth = "1000TB/s"', "nic_bandwidth = 25", "option[0] (cheap).nic_bandwidth"),
    ("price_per_gpu_hour = 1.0", "price_per_gpu_hour = -1.0", "option[0] (cheap).price_per_gpu_hour"),
    ("price_per_gpu_hour = 1.0", "prize_per_gpu_hour = 1.0", "option[0] (cheap).prize_per_gpu_hour"),
    ('merges = ["ddp", "wfbp"]', 'merges = ["ddpp"]', "option[0] (cheap).merges"),
    ('collectives = ["ring", "tree"]', 'collectives = "ring"', "option[1] (dear).collectives"),
    ("max_nodes = 4", "max_nodes = 0", "option[1] (dear).max_nodes"),
    ('name = "dear"', 'name = "cheap"', "option.name"),
    ('name = "dear"', "", "option[1].name"),
])
def test_bad_catalogue_fields_name_the_file_and_field(files, old, new, field):
    _, cat = files(text=CATALOGUE.format(cheap_nodes=2).replace(old, new, 1))
    with pytest.raises(ConfigError) as e:
        load_catalogue(cat)
    assert e.value.field == field and e.value.source == str(cat)
    assert str(cat) in str(e.value) and field in str(e.value)


def test_shipped_catalogue_loads_and_says_prices_are_examples():
    cat = load_catalogue(DEFAULT_CATALOGUE)
    assert cat.currency == "USD" and "not quotes" in cat.note
    assert {o.name for o in cat.options} >= {"eth25", "eth100", "ib400"}
    nics = sorted(o.nic.bandwidth_Bps * 8 / 1e9 for o in cat.options)
    assert 25 in nics and 100 in nics and 400 in nics


def test_gpu_counts():
    from simfog.cluster import Link

    link = Link(0.0, 1e9)
    assert ClusterOption("a", 8, 64, link, link, 1.0).gpu_counts() == [1 << k for k in range(10)]  # 1 .. 512
    assert ClusterOption("b", 6, 5, link, link, 1.0).gpu_counts() == [1, 2, 4, 6, 12, 24, 30]


def test_cli_epoch_target_writes_table_csv_and_plot(files, tmp_path, capsys):
    trace, cat = files()
    prefix = tmp_path / "p" / "plan"  # -o DIR writes DIR/plan.csv and DIR/plan.png
    argv = ["plan", str(trace), "--catalogue", str(cat), "--epoch-samples", str(640 * 3600 * 2), "--epoch-time",
            "2h", "-o", str(prefix.parent)]  # target 640 samples/s
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "cheap" in out and "EUR/epoch" in out and "test prices" in out
    rows = list(csv.DictReader(open(f"{prefix}.csv")))
    assert {"option", "gpus", "samples_per_s", "scaling_efficiency", "cost_per_hour", "cost_per_epoch"} <= set(rows[0])
    assert open(f"{prefix}.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_unreachable_and_missing_target(files, tmp_path, capsys):
    trace, cat = files()
    assert cli.main(["plan", str(trace), "--catalogue", str(cat), "--target-samples-per-s", "1e6",
                     "-o", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "best reachable" in err[0]
    assert (tmp_path / "p" / "plan.csv").exists()  # what was tried is kept
    assert cli.main(["plan", str(trace), "--catalogue", str(cat)]) == 2
    assert "--target-samples-per-s" in capsys.readouterr().err


def test_the_options_links_replace_the_workloads_network_file(files, tmp_path):
    """A workload experiment with `[cluster] network` (here a very slow one, so collective "nccl") is planned on
    each option's links: the network file describes the experiment's cluster, which the option replaces."""
    from dataclasses import replace

    from simfog import experiment, nccl, network_file

    trace, cat = files(text=CATALOGUE.format(cheap_nodes=4).replace('collectives = ["ring"]\n', ""))
    network_file.save(tmp_path / "slow.toml", nccl.NcclNetwork(intra_bus_Bps=1e9, inter_bus_Bps=1e7))
    exp_path = tmp_path / "e.toml"
    exp_path.write_text(f'[workload]\ntrace = "{trace.name}"\n[cluster]\nnodes = 1\ngpus_per_node = 8\n'
                        'network = "slow.toml"\n[comm]\nmerge = "ddp"\n')
    exp = experiment.load(exp_path)
    assert exp.network is not None and exp.comm.collective == "nccl"
    with_file = plan(exp, load_catalogue(cat), target_samples_per_s=2000).candidates
    without = plan(replace(exp, network=None), load_catalogue(cat), target_samples_per_s=2000).candidates
    assert "nccl" in set(with_file.collective) and with_file.equals(without)
    nccl_rows = with_file[with_file.collective == "nccl"]
    assert nccl_rows.scaling_efficiency.min() == pytest.approx(1.0, abs=1e-3)  # the options' links are ~free


def test_an_option_can_be_a_calibrated_network_file(files, tmp_path):
    """`network = "x.toml"` in an option: NCCL's model on that calibrated network (collective defaults to "nccl"),
    its bus bandwidths standing in for the links; a slow network needs more GPUs than a fast one for the target."""
    from simfog import nccl, network_file

    trace, _ = files()
    network_file.save(tmp_path / "fast.toml", nccl.NcclNetwork(intra_bus_Bps=1e15, inter_bus_Bps=1e15))
    network_file.save(tmp_path / "slow.toml", nccl.NcclNetwork(intra_bus_Bps=2e9, inter_bus_Bps=1e8,
                                                               latency_inter_s=50e-6))
    text = "currency = \"EUR\"\n" + "".join(
        f'[[option]]\nname = "{n}"\ngpus_per_node = 8\nmax_nodes = 16\nprice_per_gpu_hour = 1.0\n'
        f'network = "{n}.toml"\n' for n in ("fast", "slow"))
    (tmp_path / "net-cat.toml").write_text(text)
    cat = load_catalogue(tmp_path / "net-cat.toml")
    assert cat.options[0].collectives == ("nccl",) and cat.options[0].nic.bandwidth_Bps == 1e15
    result = plan(workload_experiment(trace), cat, target_samples_per_s=2000)
    best = result.feasible().groupby("option").gpus.min()
    assert best["fast"] == 32  # 2000 / 80 per GPU -> 25 -> whole nodes doubling: 32
    assert best["slow"] > best["fast"]
    bad = text.replace('network = "slow.toml"', 'network = "missing.toml"')
    (tmp_path / "bad-cat.toml").write_text(bad)
    with pytest.raises(ConfigError, match=r"option\[1\] \(slow\)\.network"):
        load_catalogue(tmp_path / "bad-cat.toml")


def test_a_target_met_with_confidence_needs_the_lower_bound_to_reach_it(files, tmp_path, capsys):
    # The trace has one sample and the links are written, not measured: both parts take the stated x/2. On the
    # (almost) free network only the compute moves the time: at twice the compute, half the throughput. 500
    # samples/s with 90 % confidence (the 80 % interval's lower bound) needs 1000 nominal: 13 GPUs, 16 in whole
    # nodes, where 7 reach 500 nominally.
    trace, cat = files()
    exp, catalogue = workload_experiment(trace), load_catalogue(cat)
    assert plan(exp, catalogue, target_samples_per_s=500).best["gpus"] == 7 == smallest_count(500)
    r = plan(exp, catalogue, target_samples_per_s=500, confidence=0.9)
    b = r.best
    assert (b["option"], b["gpus"]) == ("cheap", smallest_count(1000)) == ("cheap", 16)
    assert b["samples_per_s_lo"] == pytest.approx(b["samples_per_s"] / 2, rel=1e-4) and b["samples_per_s_lo"] >= 500
    assert "compute" in b["interval_unmeasured"] and r.info["confidence"] == 0.9
    below = r.candidates[(r.candidates.option == "cheap") & (r.candidates.gpus == 8)]
    assert (below.samples_per_s >= 500).all() and not below.meets_target.any()  # reached nominally, not surely
    for bad in (0.5, 1.0, 90):
        with pytest.raises(ConfigError, match="--confidence"):
            plan(exp, catalogue, target_samples_per_s=500, confidence=bad)
    assert cli.main(["plan", str(trace), "--catalogue", str(cat), "--target-samples-per-s", "500", "--confidence",
                     "0.9", "-o", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "90 % sure" in out and "lower bound of the 80 % prediction interval" in out and "*" in out
    rows = list(csv.DictReader(open(tmp_path / "p" / "plan.csv", newline="")))
    assert {"samples_per_s_lo", "samples_per_s_hi", "interval_unmeasured"} <= set(rows[0])
    assert cli.main(["plan", str(trace), "--catalogue", str(cat), "--gpus", "8", "--confidence", "0.9", "-o",
                     str(tmp_path / "q")]) == 0
    assert "90 % sure" in capsys.readouterr().out
