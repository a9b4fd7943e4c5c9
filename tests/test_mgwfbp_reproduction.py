"""The MG-WFBP paper's measured speedups, reproduced from the authors' own logs with simfog's own commands.

Shi, Chu, Li, "MG-WFBP", INFOCOM 2019: GoogLeNet (batch 64) on 2, 4 and 8 nodes with 10GbE, B-Caffe over MPI.
The measured throughputs are in the authors' plotting script (hclhkbu/B-Caffe scripts/gmwfbp.py,
`realdata_speedup`): per node and images/s, 81.68 on one node, then WFBP / SyncEASGD / MG-WFBP 74.83, 62.57, 79.02
on 2 nodes, 74.91, 57.67, 75.03 on 4 and 62.9, 55.58, 75.68 on 8; the speedup is nodes x rate / 81.68 (8 nodes:
6.16, 5.44, 7.41, the paper's figure). Each test imports the layer log and the OSU log of one node count
(`simfog import`), fits the OSU log (`simfog calibrate`), loads notebooks/experiments/googlenet-10gbe-N.toml (whose
header says why each number is what it is) and simulates merge = wfbp, single and mgwfbp.

Host staging: B-Caffe's allreduce timer (comm_us in the layer log) also holds the copies from the GPU to pinned
host memory and back and its reduce thread's synchronisation, which the OSU log lacks. On 2 nodes (one MPI
exchange, one bucket per blob) comm_us minus the OSU time of the same size is about 108.5 us + 0.344 ns/B; the
experiment files carry it as collective_overhead and two bucket copies (`staging` below recomputes it).

What the simulation leaves out, and how it shows (numbers from the logs, for the record):
- At 2 and 4 nodes simfog hides all of WFBP's and MG-WFBP's communication under backward (speedup N), while the
  real runs lost 8-9 % (about 35 ms per iteration; 13 ms for MG-WFBP on 2 nodes). On 2 nodes even the layer log's
  own allreduce times, replayed one after the other from when each gradient was ready, end 0.4 ms after backward:
  there the loss is not time on the wire, and no input here holds it.
- B-Caffe's in-training allreduces at 4 and 8 nodes are slower than OSU's by more than the staging: on 4 nodes the
  log's 128 allreduces take 262 ms against OSU's 128 ms for the same sizes (the replay exposes 55 ms), on 8 nodes
  its 65 take 311 ms against 232 ms; the same residual line gives 216 us + 1.34 ns/B and 451 us + 0.61 ns/B there.
- The link is the OSU log's large-message segment, so the 64 bias allreduces (< 4 KiB), which Open MPI runs by
  recursive doubling in 33-162 us, cost 2(n-1)·alpha (101, 179, 844 us). Costed by recursive doubling below
  10000 B instead (Open MPI's decision), 8-node WFBP would come out at 6.86 (+11 %) rather than 6.28: its 8-node
  figure lands within 10 % partly because that surcharge (~46 ms) stands in for the unmodelled in-training
  slowdown.
"""

from __future__ import annotations

import re
import tomllib
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from simfog import cli, experiment
from simfog.calibrate import fit
from simfog.importers import import_file
from simfog.importers.mgwfbp import network_trace_of
from simfog.simulation import simulate
from simfog.trace import load_model_trace, load_network_trace

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "bench" / "data" / "ref" / "mgwfbp-googlenet"
EXPERIMENTS = ROOT / "notebooks" / "experiments"

SINGLE_NODE = 81.68  # images/s per node on one node (realdata_speedup: 81.68*2, the same "2" on every entry)
BATCH = 64
#: nodes -> policy -> measured images/s per node (the same units as SINGLE_NODE)
MEASURED = {2: {"wfbp": 74.83, "single": 62.57, "mgwfbp": 79.02},
            4: {"wfbp": 74.91, "single": 57.67, "mgwfbp": 75.03},
            8: {"wfbp": 62.9, "single": 55.58, "mgwfbp": 75.68}}
TOLERANCE = 0.10


def paper_speedup(nodes: int, policy: str) -> float:
    return nodes * MEASURED[nodes][policy] / SINGLE_NODE


def test_the_paper_numbers():
    assert [round(paper_speedup(8, p), 2) for p in ("wfbp", "single", "mgwfbp")] == [6.16, 5.44, 7.41]


def staging() -> tuple[float, float]:
    """(per-bucket overhead s, copy bandwidth B/s) of B-Caffe's host staging, from the 2-node logs: comm_us of each
    bucket no larger than OSU's largest size, minus OSU's time at that size (linear between its sizes), fitted by
    a Theil-Sen line c + s·M (median of pairwise slopes, then median intercept: comm_us holds the odd wait of a
    millisecond). Two copies of M per bucket (to the host before MPI, back after) make s = 2 / bandwidth."""
    osu = import_file("osu", REF / "allreduce2.log", ranks=2)
    sizes = np.array([m.bytes for m in osu.measurements], dtype=float)
    times = np.array([np.median(m.time_s) for m in osu.measurements])
    buckets = network_trace_of(import_file("mgwfbp", REF / "tmp2comm.log")).measurements
    nbytes = np.array([m.bytes for m in buckets if m.bytes <= sizes.max()], dtype=float)
    extra = np.array([m.time_s[0] for m in buckets if m.bytes <= sizes.max()]) - np.interp(nbytes, sizes, times)
    slope = float(np.median([(extra[j] - extra[i]) / (nbytes[j] - nbytes[i])
                             for i, j in combinations(range(len(nbytes)), 2) if nbytes[j] != nbytes[i]]))
    return float(np.median(extra - slope * nbytes)), 2 / slope


def test_staging_is_what_the_two_node_logs_show():
    overhead, copy_Bps = staging()
    assert overhead == pytest.approx(108.5e-6, rel=1e-3) and copy_Bps == pytest.approx(5.808e9, rel=1e-3)
    for nodes in (2, 4, 8):
        comm = tomllib.loads((EXPERIMENTS / f"googlenet-10gbe-{nodes}.toml").read_text())["comm"]
        assert (comm["collective_overhead"], comm["bucket_copy_bandwidth"]) == ("108.5us", "5.808GB/s")


def header_ratio(text: str) -> float:
    """forward_per_backward of the import command written in an experiment file's header."""
    return float(re.search(r"forward_per_backward=([0-9.]+)", text).group(1))


def import_inputs(nodes: int, out: Path) -> tuple[str, Path]:
    """The experiment file's text, and the folder it resolves its paths from, with its two imports done there."""
    text = (EXPERIMENTS / f"googlenet-10gbe-{nodes}.toml").read_text()
    base = out / "notebooks" / "experiments"
    base.mkdir(parents=True)
    data = out / "out" / "mgwfbp-googlenet"
    log = str(REF / f"tmp{nodes}comm.log")
    # The ratio is one node's measured iteration, 64 images at 2 x 81.68 images/s, over the log's backward sum.
    assert cli.main(["import", "mgwfbp", log, "-o", str(out / "plain.json")]) == 0
    backward = sum(layer.backward_s[0] for layer in load_model_trace(out / "plain.json").layers)
    ratio = header_ratio(text)
    assert ratio == round(BATCH / (2 * SINGLE_NODE) / backward - 1, 4)
    assert cli.main(["import", "mgwfbp", log, "-s", f"forward_per_backward={ratio}",
                     "-o", str(data / f"googlenet-k80-{nodes}.json.gz")]) == 0
    assert cli.main(["import", "osu", str(REF / f"allreduce{nodes}.log"), "-s", f"ranks={nodes}",
                     "-o", str(data / f"osu-allreduce-{nodes}.json.gz")]) == 0
    return text, base


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_speedups_within_ten_percent_of_the_papers(nodes, tmp_path, capsys):
    text, base = import_inputs(nodes, tmp_path)
    exp = experiment.from_dict(tomllib.loads(text), base_dir=base, source=f"googlenet-10gbe-{nodes}.toml")

    # The link is the large-message segment of `simfog calibrate` on the OSU log, which bends at 12 KiB.
    assert cli.main(["calibrate", str(tmp_path / "out" / "mgwfbp-googlenet" / f"osu-allreduce-{nodes}.json.gz")]) == 0
    assert "12 KiB" in capsys.readouterr().out
    nic = fit(load_network_trace(tmp_path / "out" / "mgwfbp-googlenet" / f"osu-allreduce-{nodes}.json.gz")).fits["nic"]
    assert nic.breakpoint_bytes == 12288
    alpha, beta = nic.large
    assert exp.cluster.nic.latency_s == pytest.approx(alpha, rel=1e-3)
    assert exp.cluster.nic.bandwidth_Bps == pytest.approx(1 / beta, rel=1e-3)
    assert (exp.cluster.nodes, exp.cluster.ranks_per_node, exp.comm.collective) == (nodes, 1, "ring")

    got = {}
    for policy in ("wfbp", "single", "mgwfbp"):
        s = simulate(exp.with_comm(merge=policy)).summary()
        got[policy] = nodes * s["scaling_efficiency"]
    # One node's simulated iteration is the measured one the speedups are relative to.
    assert s["compute_s"] == pytest.approx(BATCH / (2 * SINGLE_NODE), rel=1e-4)
    errors = {p: got[p] / paper_speedup(nodes, p) - 1 for p in got}
    assert all(abs(e) < TOLERANCE for e in errors.values()), (got, errors)
    assert got["mgwfbp"] >= max(got["wfbp"], got["single"]) * (1 - 1e-9)
