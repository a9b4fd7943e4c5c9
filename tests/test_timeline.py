"""Chrome-trace timelines: the structure Perfetto needs, checked event by event against the intervals."""

from __future__ import annotations

import json
from collections import defaultdict

import pandas as pd
import pytest

from simfog import cli
from simfog.errors import ConfigError
from simfog.simulation import simulate
from simfog.timeline import chrome_trace, chrome_trace_from_intervals, parse_rank_list, write_chrome_trace

from .conftest import make_experiment, make_trace

# Three recorded iterations with very different backward times, so ranks drawing different ones wait for each other.
SAMPLES = [([0.01, 0.02, 0.01], [0.02, 0.03, 0.01]),
           ([0.01, 0.02, 0.01], [0.06, 0.05, 0.04]),
           ([0.02, 0.01, 0.01], [0.01, 0.02, 0.03])]
ELEMENTS = [1000, 200_000, 50_000]


def straggling_result(merge="wfbp"):
    trace = make_trace([0] * 3, [0] * 3, ELEMENTS, samples=SAMPLES, optimizer=0.002)
    return simulate(make_experiment(trace, compute="samples", merge=merge, iterations=4, seed=3))


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_every_event_matches_an_interval_with_the_required_keys():
    result = straggling_result()
    trace = chrome_trace(result)
    json.dumps(trace)  # serialisable as it is
    iv = result.intervals()
    events = x_events(trace)
    assert len(events) == len(iv)
    assert "wait" in set(iv.kind), "the scenario must produce waits, or the wait naming goes untested"
    sizes = {f"bucket{b['bucket']}": b["bytes"] for b in result.buckets}
    expected = defaultdict(list)
    for r in iv.itertuples():
        name = f"wait: {r.name}" if r.kind == "wait" else r.name
        tid = 0 if r.kind in ("forward", "backward", "optimizer") else 1
        expected[(r.rank, tid, name, r.iteration)].append((r.start_s, r.end_s - r.start_s))
    for e in events:
        assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid", "args"}
        assert isinstance(e["pid"], int) and e["tid"] in (0, 1)
        (start, dur), = [x for x in expected[(e["pid"], e["tid"], e["name"], e["args"]["iteration"])]
                         if abs(x[0] * 1e6 - e["ts"]) < 1e-3]
        assert e["dur"] == pytest.approx(dur * 1e6, abs=1e-3)  # microseconds, rounded to whole nanoseconds
        if e["tid"] == 1:
            bucket = e["name"].removeprefix("wait: ")
            assert bucket in sizes and e["args"]["bytes"] == sizes[bucket]
        else:
            assert e["name"] in ("forward", "backward", "optimizer") and "bytes" not in e["args"]


def test_tracks_are_named_sorted_and_compute_never_overlaps():
    result = straggling_result()
    trace = chrome_trace(result)
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert procs == {r: f"rank {r}" for r in range(4)}
    assert threads == {**{(r, 0): "compute" for r in range(4)}, **{(r, 1): "communication" for r in range(4)}}
    by_track = defaultdict(list)
    for e in x_events(trace):
        by_track[(e["pid"], e["tid"])].append(e)
    assert set(by_track) == set(threads)
    for evs in by_track.values():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)
        for a, b in zip(evs, evs[1:], strict=False):  # Perfetto cannot show overlapping X events on one thread
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-6
    assert trace["otherData"]["ranks_total"] == 4 and "note" not in trace["otherData"]
    assert trace["otherData"]["merge"] == "wfbp"


def test_many_ranks_default_to_first_and_last_32_and_say_so():
    trace = make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000])
    result = simulate(make_experiment(trace, nodes=64, gpus_per_node=4, iterations=2))  # 256 ranks, symmetric
    ct = chrome_trace(result)
    shown = sorted({e["pid"] for e in x_events(ct)})
    assert shown == list(range(32)) + list(range(224, 256))
    other = ct["otherData"]
    assert other["ranks_total"] == 256 and other["ranks_shown"] == 64
    assert "0-31, 224-255" in other["note"] and "Perfetto" in other["note"]
    picked = chrome_trace(result, ranks=[5, 200])
    assert sorted({e["pid"] for e in x_events(picked)}) == [5, 200]
    with pytest.raises(ConfigError, match="0..255"):
        chrome_trace(result, ranks=[256])


def test_measured_intervals_with_bytes_and_overlap_go_to_an_extra_lane():
    # A measured timeline (the validator's schema, plus bytes) where two collectives overlap on one rank.
    df = pd.DataFrame([
        (0, 0, "forward", "forward", 0.0, 0.010, None),
        (0, 0, "backward", "backward", 0.010, 0.030, None),
        (0, 0, "comm", "bucket0", 0.015, 0.025, 4096),
        (0, 0, "comm", "bucket1", 0.020, 0.032, 1024),
        (0, 0, "optimizer", "optimizer", 0.032, 0.033, None),
    ], columns=["rank", "iteration", "kind", "name", "start_s", "end_s", "bytes"])
    trace = chrome_trace_from_intervals(df)
    got = [(e["name"], e["tid"], e["ts"], e["dur"], e["args"].get("bytes")) for e in x_events(trace)]
    assert got == [("forward", 0, 0.0, 10000.0, None), ("backward", 0, 10000.0, 20000.0, None),
                   ("optimizer", 0, 32000.0, 1000.0, None), ("bucket0", 1, 15000.0, 10000.0, 4096),
                   ("bucket1", 3, 20000.0, 12000.0, 1024)]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {(0, 0): "compute", (0, 1): "communication", (0, 3): "communication 2"}


@pytest.mark.parametrize("change, field", [
    (lambda df: df.drop(columns="end_s"), "intervals"),
    (lambda df: df.assign(kind="compute"), "intervals.kind"),
    (lambda df: df.assign(end_s=-1.0), "intervals.end_s"),
])
def test_bad_interval_frames_are_config_errors(change, field):
    df = pd.DataFrame([(0, 0, "forward", "forward", 0.0, 0.01)],
                      columns=["rank", "iteration", "kind", "name", "start_s", "end_s"])
    with pytest.raises(ConfigError) as e:
        chrome_trace_from_intervals(change(df))
    assert e.value.field == field


def test_write_is_atomic_json_and_gzip(tmp_path):
    result = straggling_result("single")
    write_chrome_trace(result, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == json.loads(json.dumps(chrome_trace(result)))
    write_chrome_trace(result, tmp_path / "t.json.gz")
    from simfog.files import read_json

    assert read_json(tmp_path / "t.json.gz") == json.loads((tmp_path / "t.json").read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz"]  # no temporary left behind


def test_parse_rank_list():
    assert parse_rank_list("0-2,7, 10-11") == [0, 1, 2, 7, 10, 11]
    with pytest.raises(ConfigError, match="--timeline-ranks"):
        parse_rank_list("a-b", field="--timeline-ranks")


EXP = """
seed = 1
iterations = 2
[workload]
trace = "t.json"
compute = "mean"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
collective = "ring"
merge = "wfbp"
"""


def test_simulate_timeline_option(tmp_path, capsys):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    out = tmp_path / "tl.json"
    assert cli.main(["simulate", str(tmp_path / "e.toml"), "--timeline", str(out), "--json",
                     "--timeline-ranks", "1-2"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] == 4  # stdout is still one JSON object
    trace = json.loads(out.read_text())
    assert {e["pid"] for e in x_events(trace)} == {1, 2}
    assert {e["name"] for e in x_events(trace)} == {"forward", "backward", "optimizer", "bucket0", "bucket1"}
