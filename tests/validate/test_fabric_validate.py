"""`simfog validate` on emulated switch tiers: an experiment with a two-tier fat tree [fabric], and a jobs file of two
jobs measured alone and together against simfog.jobs' slowdown; and the messages for what cannot be validated.

The real runs need root, `ip` and tc (marked `root`; they skip with the reason netemu.available() gives). They run
on a shared 2-core host, so their figures are the emulation's, not accuracy claims: the assertions are on what
the validator writes and on bounds that only a broken path misses.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest

from simfog import jobs
from simfog.cli import main
from simfog.errors import ConfigError
from simfog.experiment import from_dict
from validate.cluster.fabric_emu import fabric_keys
from validate.comparison import compare
from validate.jobs import check_jobs, stretched
from validate.run import Options, check_experiment

from ..conftest import make_trace
from .conftest import emulation_available

# 2 leaves of 2 nodes, NICs 200 Mbit/s, each leaf's uplink 2:1 oversubscribed (200 Mbit/s: one NIC's worth)
FABRIC = 'kind = "fat_tree"\nnodes_per_leaf = 2\nleaves = 2\nleaf_oversubscription = 2\n'
CLUSTER = 'nic_bandwidth = "200Mbit/s"\ngpus_per_node = 1\n'


def _trace(tmp_path):
    """6 layers, 1.5 MB of gradients: at 200 Mbit/s communication is most of an iteration (~2/3), so a shared
    uplink shows."""
    make_trace([2e-3] * 6, [4e-3] * 6, [65536] * 6, samples=[([2e-3] * 6, [4e-3] * 6),
                                                                ([2.5e-3] * 6, [3.5e-3] * 6)]).save(tmp_path / "t.json")


def _experiment(tmp_path, placement: str, fabric: str = FABRIC) -> str:
    _trace(tmp_path)
    path = tmp_path / "exp.toml"
    path.write_text(f'seed = 3\niterations = 4\n[workload]\ntrace = "t.json"\ncompute = "samples"\n'
                    f'[cluster]\nnodes = 4\n{CLUSTER}[comm]\nmerge = "wfbp"\n[fabric]\n{fabric}'
                    f'placement = {placement}\n')
    return str(path)


def _jobs_file(tmp_path, fabric: str = FABRIC, jobs_: int = 2) -> str:
    """Two jobs of 2 nodes, each with one node on each leaf (job a on nodes 0 and 2, job b on 1 and 3): both rings
    cross both uplinks in both directions, so together each gets half of an uplink."""
    _trace(tmp_path)
    tables = "".join(f'[[job]]\nname = "{name}"\nworkload = {{ trace = "t.json", compute = "samples" }}\n'
                     f'ranks = 2\nplacement = {nodes}\nmerge = "wfbp"\n'
                     for name, nodes in (("a", "[0, 2]"), ("b", "[1, 3]"))[:jobs_])
    path = tmp_path / "jobs.toml"
    path.write_text(f'seed = 3\niterations = 4\n[cluster]\nnodes = 4\n{CLUSTER}[fabric]\n{fabric}{tables}')
    return str(path)


# ---- bad input: one message naming the file, the field, the value and what is allowed ----

@pytest.mark.parametrize("fabric, field, allowed", [
    ('kind = "rail"\nnodes_per_group = 2\n', "fabric.kind", "a two-tier fat_tree"),
    ('kind = "fat_tree"\ntiers = 3\nnodes_per_leaf = 1\nleaves_per_pod = 2\npods = 2\n', "fabric.kind",
     "FatTree of 3 tiers"),
])
def test_a_fabric_the_emulation_has_no_tiers_for_is_refused_with_one_message(tmp_path, capsys, fabric, field,
                                                                            allowed):
    path = _experiment(tmp_path, '"contiguous"', fabric)
    assert main(["validate", path, "--csv", str(tmp_path / "v.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("simfog: error:") and "Traceback" not in err
    assert path in err and field in err and allowed in err
    assert not (tmp_path / "v.csv").exists()


def test_a_fabric_on_plain_loopback_and_the_wrong_launcher_are_refused(tmp_path, capsys):
    path = _experiment(tmp_path, '"contiguous"')
    assert main(["validate", path, "--loopback"]) == 2
    err = capsys.readouterr().err
    assert path in err and "--loopback = True: left out for an experiment with a [fabric]" in err
    exp = from_dict({"seed": 0, "iterations": 2, "workload": {"trace": str(tmp_path / "t.json")},
                     "cluster": {"nodes": 4, "nic_bandwidth": "200Mbit/s"},
                     "fabric": {"kind": "fat_tree", "nodes_per_leaf": 2, "leaves": 2}})
    with pytest.raises(ConfigError, match="--launcher local and --backend gloo"):
        check_experiment(exp, "replay", "gloo", "torchrun")


def test_jobs_files_that_cannot_be_validated_say_why(tmp_path, capsys):
    one = _jobs_file(tmp_path, jobs_=1)
    assert main(["validate", one]) == 2
    err = capsys.readouterr().err
    assert one in err and "job = '1 table': at least two [[job]] tables" in err
    flat = _jobs_file(tmp_path, fabric='kind = "flat"\n')
    assert main(["validate", flat]) == 2
    err = capsys.readouterr().err
    assert flat in err and "fabric.kind = 'flat'" in err and "share no link" in err
    assert main(["validate", _jobs_file(tmp_path), "--merge", "ddp"]) == 2
    assert "--merge = 'ddp': left out for a jobs file" in capsys.readouterr().err
    assert main(["validate", _jobs_file(tmp_path), "--loopback"]) == 2
    assert "--loopback = True: left out for a jobs file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"job\[0\]\.workload\.trace = 'toy': a trace of a zoo model"):
        check_jobs(jobs.load(_jobs_file(tmp_path)), Options(mode="model"))  # a job's own field names its job


def test_rows_name_the_fabric_and_placement_and_jobs_are_stretched_to_overlap(tmp_path):
    _trace(tmp_path)
    table = {"seed": 0, "iterations": 2, "workload": {"trace": str(tmp_path / "t.json")},
             "cluster": {"nodes": 4, "nic_bandwidth": "200Mbit/s"}}
    exp = from_dict({**table, "fabric": {"kind": "fat_tree", "nodes_per_leaf": 2, "leaves": 2,
                                         "leaf_oversubscription": 2, "placement": [0, 2, 1, 3]}})
    assert fabric_keys(exp.cluster) == {"fabric": "fat_tree 2 leaves x 2 nodes, uplink 200 Mbit/s (2:1)",
                                        "placement": "given: nodes 0 2 1 3"}
    scattered = from_dict({**table, "cluster": {"nodes": 2, "nic_bandwidth": "200Mbit/s"},
                           "fabric": {"kind": "fat_tree", "nodes_per_leaf": 2, "leaves": 2,
                                      "placement": "scattered", "placement_seed": 5}})
    nodes = " ".join(map(str, scattered.cluster.fabric.nodes(2).nodes))
    assert fabric_keys(scattered.cluster)["placement"] == f"scattered seed 5: nodes {nodes}"
    assert fabric_keys(from_dict(table).cluster) == {}
    loaded = jobs.load(_jobs_file(tmp_path))
    fast = [loaded[0], replace(loaded[1], experiment=loaded[1].experiment.with_comm(merge="single"))]
    times = jobs.run(fast).jobs
    out = stretched(fast)
    span = max(j.experiment.iterations * t.together_s for j, t in zip(fast, times))
    for job, t in zip(out, times):  # each runs at least as long as the slowest, by less than one iteration more
        assert span <= job.experiment.iterations * t.together_s < span + t.together_s or \
            job.experiment.iterations == 4
    assert min(j.experiment.iterations for j in out) == 4


def test_the_together_prediction_replays_the_jobs_from_their_measured_start_offsets(tmp_path):
    """validate.jobs' prediction together: the jobs' predicted runs alone (here simulated) replayed from the offsets
    at which their first measured iterations started, relative to the first; a job that did not run starts with the
    first. The prediction is simfog.jobs.replayed at those offsets, and one of the start phases of the band."""
    from types import SimpleNamespace

    from simfog.simulation import simulate
    from validate.comparison.compare import steady_iteration_s
    from validate.jobs import _predicted

    loaded = jobs.load(_jobs_file(tmp_path))
    alone = [simulate(j.experiment) for j in loaded]
    groups = [SimpleNamespace(prepared=[SimpleNamespace(predicted=r)]) for r in alone]
    lines = jobs.timelines(loaded, alone)
    offsets, predicted, bands = _predicted(groups, [(5.25, 9.0), (5.0, 9.5)], loaded, lines)
    assert offsets == [0.25, 0.0]
    expected = jobs.replayed(loaded, alone, lines, [0.25, 0.0])
    for p, e, a, (lo, hi) in zip(predicted, expected, alone, bands):
        assert p.interval_records() == e.interval_records()
        assert lo <= steady_iteration_s(p) / steady_iteration_s(a) <= hi and hi > 1.0
    assert _predicted(groups, [None, (2.0, 3.0)], loaded, lines)[0] == [0.0, 0.0]
    # its interval: the run alone's relative bounds around the time together (the replay's experiment is alone's)
    t = steady_iteration_s(predicted[0])
    keys = compare.interval_keys(predicted[0], t, t)
    a = compare.interval_keys(alone[0], 1.0, 1.0)
    assert keys["predicted_iteration_lo_s"] == pytest.approx(t * a["predicted_iteration_lo_s"], rel=1e-12)
    assert keys["predicted_iteration_hi_s"] == pytest.approx(t * a["predicted_iteration_hi_s"], rel=1e-12)


# ---- real runs on emulated tiers ----

def _skip_without_emulation():
    ok, why = emulation_available()
    if not ok:
        pytest.skip(f"no emulated cluster here: {why}")


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == compare.COLUMNS
    return rows


@pytest.mark.root
def test_an_experiment_on_two_leaves_is_validated_on_the_tiers(tmp_path):
    """4 nodes in the order 0 2 1 3 on 2 leaves of 2 at 2:1: the ring crosses each uplink twice each way, which
    simfog.fabric prices at twice the NIC's time per byte. The row says where it ran; its error is bounded by 50 %
    as the flat cluster's end-to-end test bounds it (a wrong shaper, calibration or fabric factor misses it by far:
    the factor alone is 2)."""
    _skip_without_emulation()
    out = tmp_path / "v.csv"
    assert main(["validate", _experiment(tmp_path, "[0, 2, 1, 3]"), "--warmup", "2", "--emulate",
                 "--csv", str(out)]) == 0
    [row] = _rows(out)
    assert row["error"] == "" and row["emulated"] == "True"
    assert row["fabric"] == "fat_tree 2 leaves x 2 nodes, uplink 200 Mbit/s (2:1)"
    assert row["placement"] == "given: nodes 0 2 1 3"
    err = float(row["rel_error"])
    assert math.isfinite(err) and abs(err) < 0.5


@pytest.mark.root
def test_two_jobs_on_one_fabric_alone_and_together(tmp_path, capsys):
    """Jobs a (nodes 0, 2) and b (1, 3) of the jobs file above: each alone, then both at once. Every row is
    there and error-free; each together row carries both slowdowns, its prediction > 1 (the jobs share both
    uplinks), and the two jobs overlapped for most of the measured window (the start gate, the stretched
    iterations). The prediction starts each job at its measured start offset, and falls in its band over start
    phases."""
    _skip_without_emulation()
    out = tmp_path / "v.csv"
    assert main(["validate", _jobs_file(tmp_path), "--warmup", "2", "--csv", str(out)]) == 0
    rows = _rows(out)
    assert [(r["id"], r["job"]) for r in rows] == [("a-alone", "a"), ("b-alone", "b"), ("a-together", "a"),
                                                  ("b-together", "b")]
    for r in rows:
        assert r["error"] == "" and r["emulated"] == "True"
        assert r["fabric"] == "fat_tree 2 leaves x 2 nodes, uplink 200 Mbit/s (2:1)"
    assert [r["placement"] for r in rows[:2]] == ["given: nodes 0 2", "given: nodes 1 3"]
    for alone, r in zip(rows[:2], rows[2:]):
        assert float(r["measured_alone_s"]) == float(alone["measured_iteration_s"])
        assert float(r["predicted_alone_s"]) == float(alone["predicted_iteration_s"])
        m, p = float(r["measured_slowdown"]), float(r["predicted_slowdown"])
        assert m == float(r["measured_iteration_s"]) / float(r["measured_alone_s"])
        assert p > 1.05 and m > 0
        assert float(r["slowdown_rel_error"]) == pytest.approx((p - m) / m)
        assert float(r["overlap"]) > 0.5
        # the prediction replays the jobs from their measured start offsets, one of its start phases
        assert float(r["predicted_slowdown_lo"]) <= p <= float(r["predicted_slowdown_hi"])
    offsets = [float(r["start_offset_s"]) for r in rows[2:]]
    assert min(offsets) == 0.0 and max(offsets) < 1.0  # the first job to start is the clock's 0; the gate holds
    printed = capsys.readouterr().out.splitlines()
    table = printed[next(i for i, line in enumerate(printed) if "slowdown measured" in line) + 1:]
    assert [line.split()[0] for line in table] == ["a", "b"]  # one line per job


def test_the_bench_s_fabric_jobs_are_placed_as_its_docstring_says(tmp_path):
    """Contiguous: a leaf each, nothing shared (simfog.jobs: slowdown exactly 1); scattered: each job on both
    leaves, both rings on both uplinks (a slowdown > 1); --quick keeps the scattered pair."""
    from pathlib import Path

    from validate.bench import fabric_jobs

    trace = Path(__file__).resolve().parents[2] / "traces" / "mlp-cpu-b1024.json.gz"
    placed = {label: js for label, js in fabric_jobs(trace)}
    assert [j.nodes for j in placed["contiguous"]] == [(0, 1), (2, 3)]
    assert [j.nodes for j in placed["scattered"]] == [(1, 2), (0, 3)]
    assert [t.slowdown for t in jobs.run(placed["contiguous"]).jobs] == [1.0, 1.0]
    assert all(t.slowdown > 1.2 for t in jobs.run(placed["scattered"]).jobs)
    assert [label for label, _ in fabric_jobs(trace, quick=True)] == ["scattered"]
    assert all(j.name.startswith("fabric-") for _, js in fabric_jobs(trace) for j in js)  # bench/fabric.py's rows
