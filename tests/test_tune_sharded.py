"""Sharded tuning (simfog.tune_sharded): optima known by hand, the defaults row, infeasible settings counted, the
CLI end to end.

Every example uses collective = "linear" (every collective T(M) = α + β·M whatever its kind and group) on 2 nodes x
2 GPUs, and a trace of four layers of 1 ms forward and 1 ms backward, each with one 1 MB gradient (250,000 float32):
4 MB of parameters, 1 MB per rank when sharded 4 ways.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from simfog import cli
from simfog.errors import ConfigError, Infeasible
from simfog.tune_sharded import hsdp_groups, tune_sharded

from .conftest import make_experiment, make_trace

MB = 10**6
TRACE = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4)


def _fsdp(**kw):
    return make_experiment(TRACE, algorithm="fsdp", **kw)


def _with_memory(exp, gpu_memory_B):
    return replace(exp, cluster=replace(exp.cluster, gpu_memory_B=gpu_memory_B))


def test_huge_latency_prefers_one_unit_gathered_once():
    # T(M) = 1 s: every collective costs 1 s, so the fewest collectives win: one unit ("model"), not resharded
    # after forward: AG 0-1 s, forward 1-1.004, backward 1.004-1.008, RS 1.008-2.008 s.
    r = tune_sharded(_fsdp(alpha=1.0, beta=0.0))
    assert r.best["fsdp_unit"] == "model" and r.best["units"] == 1 and r.best["reshard_after_forward"] is False
    assert r.best["iteration_time_s"] == pytest.approx(2.008, rel=1e-12)
    # FSDP2's defaults: per layer, prefetch 1, resharded: 4 forward AGs back to back (0-4 s; F3 4-4.001), then 4
    # all-gathers and 4 reduce-scatters in backward, which one communicator runs one at a time in issue order (AG3'
    # 4.001, AG2', RS3, AG1', RS2, AG0', RS1, RS0 ends 12.001): 12 collectives of 1 s.
    d = r.default
    assert (d["fsdp_unit"], d["prefetch"], d["reshard_after_forward"]) == ("layer", 1, True)
    assert d["iteration_time_s"] == pytest.approx(12.001, rel=1e-12)
    assert r.settings.default.sum() == 1 and r.settings.iloc[0].default
    table = r.table()
    assert list(table.setting[:2]) == ["best", "defaults"]
    assert table.slower_than_best[1] == pytest.approx(12.001 / 2.008 - 1, rel=1e-9)
    assert r.infeasible == 0 and r.reasons == {}
    # Settings giving the same plan are simulated once: "model" with any prefetch is one setting per reshard value.
    model = r.settings[r.settings.units == 1]
    assert len(model) == 2


def test_tight_memory_forces_reshard_after_forward():
    # Without a limit, keeping parameters after forward is faster (no all-gathers in backward)...
    free = tune_sharded(_fsdp(alpha=1e-3, beta=1e-9))
    assert free.best["reshard_after_forward"] is False
    # ... but it holds every unit unsharded from forward's end. Per rank (MB): 1 shard + 1 momentum throughout; per
    # layer, backward of l2 after l3's: params 1 + 4 - 1 (l3 resharded), l3's sharded gradient 0.25 and l2's unsharded
    # gradients 1, l3's reduce-scatter input 1 still in flight: 7.25 (whole-model and 2-layer units more). Resharding
    # per layer with prefetch 1 peaks at l1's backward: params 1 + 1, gradients 0.5 + 1, l2's reduce-scatter input 1
    # and l0's prefetched all-gather output 1, 6.5 with momentum; prefetch 0 5.75. With 7 MB per GPU only those fit.
    exp = _with_memory(_fsdp(alpha=1e-3, beta=1e-9), 7 * MB)
    r = tune_sharded(exp)
    assert r.best["reshard_after_forward"] is True and r.best["memory_peak_B"] <= 7 * MB
    s = r.settings
    assert not s[~s.reshard_after_forward].feasible.any()
    assert (s[~s.reshard_after_forward].memory_peak_B >= 7.25 * MB).all()  # memory still reported when infeasible
    assert r.infeasible == int((~s.feasible).sum()) == int((s.memory_peak_B > 7 * MB).sum()) > 0
    assert r.reasons == {"over cluster.gpu_memory": r.infeasible}
    assert s[~s.feasible].iteration_time_s.isna().all()
    assert r.default["feasible"] and r.default["memory_peak_B"] == 6.5 * MB


def test_nothing_fits():
    exp = _with_memory(_fsdp(), 1 * MB)
    with pytest.raises(Infeasible, match=r"no fsdp setting of the \d+ searched fits: \d+ over cluster.gpu_memory"):
        tune_sharded(exp)


def test_hsdp_searches_every_group_with_the_node_as_default():
    assert hsdp_groups(16, 8) == [1, 2, 4, 8, 16]
    assert hsdp_groups(24, 8) == [1, 2, 4, 8, 24]
    r = tune_sharded(make_experiment(TRACE, algorithm="hsdp", alpha=1e-3, beta=1e-9), sizes=2, max_prefetch=1)
    assert sorted(set(r.settings.hsdp_group)) == [1, 2, 4]
    assert r.default["hsdp_group"] == 2  # gpus_per_node
    assert r.best["iteration_time_s"] <= r.default["iteration_time_s"]
    assert "hsdp_group" in r.knobs and any(r.table().setting == "hsdp_group = 1")


def test_zero3_against_deepspeed_defaults():
    r = tune_sharded(make_experiment(TRACE, algorithm="zero3", alpha=1.0, beta=0.0), sizes=3)
    d = r.default
    assert (d["stage3_prefetch_bucket_size"], d["reduce_bucket_size"], d["overlap_comm"]) == (50_000_000, 500_000_000,
                                                                                               True)
    assert r.best["iteration_time_s"] <= d["iteration_time_s"]
    assert r.knobs == ("stage3_prefetch_bucket_size", "reduce_bucket_size", "overlap_comm")


@pytest.mark.parametrize("kwargs, field", [({"sizes": -1}, "sizes"), ({"max_prefetch": 1.5}, "max_prefetch")])
def test_bad_search_settings(kwargs, field):
    with pytest.raises(ConfigError) as e:
        tune_sharded(_fsdp(), **kwargs)
    assert e.value.field == field


def test_other_algorithms_are_refused():
    with pytest.raises(ConfigError, match="comm.algorithm"):
        tune_sharded(make_experiment(TRACE))


EXP = """
iterations = 2
[workload]
trace = "t.json"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
gpu_memory = "7MB"
[comm]
algorithm = "fsdp"
collective = "linear"
alpha = "1ms"
beta = "1ns/B"
"""


def test_cli_end_to_end(tmp_path, capsys):
    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--sizes", "3", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "FSDP2 defaults: fsdp_unit = layer, prefetch = 1, reshard_after_forward = true" in out
    assert "skipped as infeasible" in out and "over cluster.gpu_memory" in out
    assert (tmp_path / "out" / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(tmp_path / "out" / "tune.csv")))
    assert {"fsdp_unit", "prefetch", "reshard_after_forward", "iteration_time_s", "memory_peak_B", "feasible",
            "reason", "default"} <= set(rows[0])
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--sizes", "3", "--json", "-o", str(tmp_path / "j")]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["algorithm"] == "fsdp" and r["best"]["reshard_after_forward"] is True
    assert r["defaults"]["prefetch"] == 1 and r["infeasible"] > 0
    assert r["infeasible_reasons"] == {"over cluster.gpu_memory": r["infeasible"]}
    assert r["best"]["memory_peak_B"] <= 7e6 and r["best"]["iteration_time_s"] <= r["defaults"]["iteration_time_s"]
    # threshold options are refused for a sharded experiment, sharded ones for allreduce
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--points", "5"]) == 2
    assert "--points" in capsys.readouterr().err
    (tmp_path / "a.toml").write_text(EXP.replace('algorithm = "fsdp"', 'algorithm = "allreduce"').replace(
        'gpu_memory = "8MB"\n', ""))
    assert cli.main(["tune", str(tmp_path / "a.toml"), "--sizes", "3"]) == 2
    assert "--sizes" in capsys.readouterr().err
