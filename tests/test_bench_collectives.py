"""bench/collectives.py's machinery on a tiny synthetic corpus: cluster discovery (corpus folders and reference
facts whose logs lie elsewhere), the calibration / held-out split, which facts reach the calibration, and the rule
that sets disturbed points aside. The bench's figures are not asserted (the synthetic times are made up)."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simfog.trace import Measurement, NetworkTrace, Provenance

from . import nccl_log_writer as writer
from .conftest import REPO

_spec = importlib.util.spec_from_file_location("simfog_bench_nccl_corpus", REPO / "bench" / "nccl_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = corpus
_spec.loader.exec_module(corpus)

SIZES = [2**k for k in range(3, 21, 2)]  # 8 B .. 1 MiB, 9 sizes


def _log(path: Path, collective: str, nodes: int, gpn: int, slow: dict | None = None) -> None:
    """A new-format nccl-tests log; `slow` {size: factor} multiplies those sizes' times (a disturbed run)."""
    plain = writer.time_us

    def time_us(c, nbytes, ranks, in_place=False):
        return plain(c, nbytes, ranks, in_place) * (slow or {}).get(nbytes, 1.0)

    old, writer.time_us = writer.time_us, time_us
    try:
        lines = writer.run_lines("new", collective, sizes=SIZES, hosts=[f"n{i}" for i in range(nodes)],
                                 gpus_per_node=gpn)
    finally:
        writer.time_us = old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(writer.log_text(lines))


def _facts(folder: Path, name: str, files: dict, extra: str = "") -> None:
    entries = "\n".join(f'"{f}" = {{ nodes = {n}, gpus_per_node = {g}, ranks = {n * g}, collectives = ["{c}"]'
                        + (f', note = "{note}"' if note else "") + " }"
                        for f, (n, g, c, note) in files.items())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "facts.toml").write_text(
        f'cluster = "{name}"\ngpu_arch = "ampere"\ngpus_per_node = 8\nnics_per_node = 4\nnccl_version = "2.18"\n'
        f'{extra}\n[source]\ngpu_arch = "test"\n\n'
        '[inferred]\nintra = { value = "nvswitch", reason = "test" }\n'
        'nic_bandwidth = { value = "200Gbit/s", reason = "test" }\n\n'
        f"[files]\n{entries}\n")


@pytest.fixture
def tiny(tmp_path):
    """Two corpus clusters (one without facts.toml: not a cluster) and one reference cluster whose logs lie in
    another folder, with two disturbed sizes and one log noted for network timeouts."""
    data, ref_facts, ref_logs = tmp_path / "corpus", tmp_path / "ref-facts", tmp_path / "ref"
    a = data / "alpha"
    _log(a / "one.log", "allreduce", 1, 8)
    _log(a / "two.log", "allreduce", 2, 8, slow={2**9: 3.0})   # calibration: 512 B set aside
    _log(a / "four.log", "allreduce", 4, 8, slow={2**15: 2.0})  # held out: 32 KiB set aside
    _log(a / "eight.log", "allgather", 8, 8)
    _facts(a, "alpha", {"one.log": (1, 8, "all_reduce", ""), "two.log": (2, 8, "all_reduce", ""),
                        "four.log": (4, 8, "all_reduce", ""), "eight.log": (8, 8, "all_gather", "")})
    (data / "not-a-cluster").mkdir()
    (data / "not-a-cluster" / "README.md").write_text("no facts here")
    _log(ref_logs / "gamma" / "sub" / "two.log", "allreduce", 2, 4)
    _log(ref_logs / "gamma" / "sub" / "three.log", "allreduce", 3, 4)
    _log(ref_logs / "gamma" / "sub" / "six.log", "allreduce", 6, 4)
    _facts(ref_facts / "gamma", "gamma", {"sub/two.log": (2, 4, "all_reduce", ""),
                                          "sub/three.log": (3, 4, "all_reduce", ""),
                                          "sub/six.log": (6, 4, "all_reduce", "139 network timeouts")})
    _facts(ref_facts / "absent", "absent", {"x.log": (1, 8, "all_reduce", "")})  # its logs are not in ref_logs
    return data, ref_facts, ref_logs


def test_discovery_finds_every_cluster_folder_and_reference_facts_with_their_logs(tiny):
    data, ref_facts, ref_logs = tiny
    clusters = corpus.discover(data, ref_facts, ref_logs)
    assert [(c.name, c.reference) for c in clusters] == [("alpha", False), ("gamma", True)]
    gamma = clusters[1]
    assert gamma.logs_dir == ref_logs / "gamma"
    assert corpus.read(gamma, gamma.logs[0]).measurements[0].nodes == 2


def test_split_holds_out_three_nodes_and_more_gpus_per_node_than_any_small_log():
    logs = (corpus.Log("a", 1, 4, 4, ()), corpus.Log("b", 2, 4, 8, ()), corpus.Log("c", 1, 8, 8, ()),
            corpus.Log("d", 3, 2, 6, ()), corpus.Log("e", 10, 8, 80, ()))
    cal, held = corpus.Cluster("x", Path("."), {}, logs).split()
    assert [g.path for g in cal] == ["a", "b", "c"] and [g.path for g in held] == ["d", "e"]
    # no log of at most 2 nodes has 8 GPUs per node: a 2-node log with 8 is beyond them
    logs = (corpus.Log("a", 1, 4, 4, ()), corpus.Log("b", 2, 8, 16, ()), corpus.Log("c", 2, 4, 8, ()))
    cal, held = corpus.Cluster("x", Path("."), {}, logs).split()
    assert [g.path for g in cal] == ["a", "b", "c"] and held == ()


def test_stated_facts_go_in_inferred_ones_only_where_simfog_has_a_default():
    facts = {"nccl_version": "2.21.5", "nics_per_node": 2, "gpu_nic_path": ["sys", "phb", "sys", "phb"],
             "cpu_vendor": "amd",
             "inferred": {"nic_bandwidth": {"value": "200Gbit/s", "reason": "r"},
                          "intra": {"value": "nvlink", "reason": "r"},
                          "cpu_vendor": {"value": "intel", "reason": "stated wins"},
                          "gpus_per_nic": {"value": 2, "reason": "not a simfog fact"}}}
    kwargs, given, used, left = corpus.fit_arguments(facts)
    assert kwargs == {"version": "2.21.5", "nics_per_node": 2, "gpu_nic_path": "phb", "cpu_vendor": "amd",
                      "intra_transport": "nvlink"}
    assert used == ["intra=nvlink"] and left == ["nic_bandwidth=200Gbit/s"]
    assert corpus.fit_arguments({"nic_bandwidth": "200Gbit/s", "cpu_vendor": "nvidia-grace"})[0] == {
        "nic_Bps": 25e9, "cpu_vendor": "arm"}


def _trace(times: list[tuple[int, float]], op: str = "allreduce") -> NetworkTrace:
    ms = tuple(Measurement(op, 8, 2, b, (t, t * 1.5)) for b, t in times)
    return NetworkTrace("nccl", "ib", Provenance("t", "t", "t"), ms,
                        {"nccl_tests": [{"header": "nThread 1 nGpus 1", "measurements": [0, len(ms)]}]})


def test_disturbed_rule_sets_aside_sizes_slower_than_a_larger_one():
    log = corpus.Log("x", 2, 4, 8, ("all_reduce",))
    # 64 B is 1.3 x the 256 B time two sizes on (the next size is slow too: both go); 1 KiB is within 1.2 x of 2 KiB
    t = _trace([(16, 10e-6), (64, 13e-6), (128, 12.5e-6), (256, 10e-6), (1024, 23e-6), (2048, 20e-6)])
    assert corpus.disturbed(t, log) == {1, 2}
    assert corpus.disturbed(t, corpus.Log("x", 2, 4, 8, (), note="log ends with 'Network Timeouts: 3'")) == set(
        range(6))
    # the least of out-of-place and in-place is the time; a repeated size is compared with larger sizes only
    assert corpus.disturbed(_trace([(8, 10e-6), (8, 30e-6), (16, 10e-6)]), log) == {1}
    kept = corpus.without(t, {1, 2})
    assert [m.bytes for m in kept.measurements] == [16, 256, 1024, 2048]
    assert kept.extra["nccl_tests"][0]["measurements"] == [0, 4]


def test_bench_runs_the_corpus_counts_what_it_sets_aside_and_ends_with_the_summary(tiny):
    data, ref_facts, ref_logs = tiny
    out = subprocess.run([sys.executable, str(REPO / "bench" / "collectives.py"), "--corpus", str(data),
                          "--ref-facts", str(ref_facts), "--ref", str(ref_logs)],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    assert "== alpha:" in out and "== gamma (reference set):" in out and "absent" not in out
    assert re.search(r"calibration: \d+ points \(1 set aside\)", out)  # alpha's 512 B at 2 nodes
    # held out: alpha's 32 KiB at 4 nodes and the 9 sizes of gamma's 6-node log noted for timeouts
    assert re.search(r"^alpha\s+\d+\s+1 ", out, re.M) and re.search(r"^gamma\s+\d+\s+9 ", out, re.M)
    assert "inferred, not used (simfog calibrates without them): nic_bandwidth=200Gbit/s" in out
    # the unidentified terms are learned leave-one-cluster-out: each cluster says what it was predicted with
    assert out.count("(learned from the other clusters' held-out points)") == 2
    assert "# learned from every cluster: tree fill" in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"clusters=2 points=(\d+) coverage90=[\d.]+ median=[\d.]+ worst=[\d.]+ "
                        r"halfwidth90=[\d.]+", last)
    assert "# 90% intervals, each cluster's fitted without it, by extrapolation distance" in out
    # per distance (nodes predicted / calibrated: 4 / 2 and 3 / 2 -> x2, 8 / 2 -> x4-8)
    assert re.search(r"^#   distance x2 +points= *\d+ coverage90=", out, re.M)
    assert re.search(r"^#   distance x4-8 +points= *\d+ coverage90=", out, re.M)
    # alpha: 4 nodes less one point, 8 nodes (allgather); gamma: 3 nodes (the 6-node log is all set aside)
    assert int(re.search(r"points=(\d+)", last).group(1)) == (len(SIZES) - 1) + len(SIZES) + len(SIZES)


def test_in_sample_calibrates_on_every_log_and_scores_the_same_held_out_points(tiny):
    """--in-sample (the model family's floor): each cluster fitted on all its logs, the held-out points as the
    held-out run counts them (disturbed ones still set aside), and the half-width each size regime needs."""
    data, ref_facts, ref_logs = tiny
    out = subprocess.run([sys.executable, str(REPO / "bench" / "collectives.py"), "--corpus", str(data),
                          "--ref-facts", str(ref_facts), "--ref", str(ref_logs), "--in-sample"],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}).stdout
    assert re.search(r"^alpha\s+17\s", out, re.M) and re.search(r"^gamma\s+9\s", out, re.M)
    assert "learned" not in out  # nothing learned across clusters: the shipped values
    assert re.search(r"^# 90 % half-width each size regime would need in-sample: small [\d.]+%", out, re.M)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"in_sample clusters=2 points=26 median=[\d.]+ worst=[\d.]+ clusters_over15=[012] "
                        r"halfwidth90=[\d.]+", last)


def test_coverage_is_judged_on_intervals_fitted_without_the_cluster():
    """Cluster a's points are judged by b's and c's scores only: with b's and c's 19 small-message scores 0.01 ..
    0.19 the 90 % half-width is the 18th, 0.18 (k = ceil(20 * 0.9)); a's own huge scores do not widen it."""
    spec = importlib.util.spec_from_file_location("simfog_bench_collectives", REPO / "bench" / "collectives.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # (its dataclasses look their module up)
    spec.loader.exec_module(bench)

    class P:  # a held-out point: 1 KiB (small regime), predicted 1 s
        def __init__(self, measured):
            self.bytes, self.predicted_s, self.measured_s = 1024, 1.0, measured

    others = [0.01 * k for k in range(1, 20)]
    scores = {"a": {"small": [5.0] * 50, "medium": [], "large": []},
              "b": {"small": others[:10], "medium": [], "large": []},
              "c": {"small": others[10:], "medium": [], "large": []}}
    inside, widths = bench.coverage([P(math.exp(0.17)), P(math.exp(-0.179)), P(math.exp(0.185))], scores, "a")
    assert inside == [True, True, False]
    assert widths == pytest.approx([math.sinh(0.18)] * 3)
