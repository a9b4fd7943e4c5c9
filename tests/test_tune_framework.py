"""Tuning a framework's own knobs (simfog.tune_framework): the widest plateau on hand-made curves, DDP, Horovod and
BAGUA answers worked by hand, "keep the default" within the tolerance, and the CLI end to end.

The examples use collective = "linear" (T(M) = α + β·M) on 2 nodes x 2 GPUs and four layers of 1 ms forward and
1 ms backward, each with one 1 MB gradient (250,000 float32 = 0.954 MiB): gradients ready 1, 2, 3, 4 ms into
backward (5, 6, 7, 8 ms into the iteration). DDP's MiB series then runs 0.7, 1, 1.5, 2, 3, 5 (and 25, its default).
"""

from __future__ import annotations

import csv
import json
import math

import pytest

import simfog
from simfog import cli
from simfog.errors import ConfigError
from simfog.run_bands import ratio_interval
from simfog.tune import tune, widest_plateau
from simfog.tune_framework import knobs_of, tune_framework
from simfog.tune_sharded import tune_sharded

from .conftest import make_experiment, make_trace

TRACE = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4)
MiB = 1 << 20


@pytest.fixture(autouse=True)
def links_at_x2(monkeypatch):
    """The hand-worked answers below take the links nobody measured at x/2 (ln 2), as before the learned prior
    (simfog.nccl.prior, whose band tests/test_network_prior.py checks) replaced that default: the tuner's logic is
    what is tested here, not the prior's width."""
    from simfog.bands import Part
    from simfog.nccl import prior

    monkeypatch.setattr(prior, "network_part", lambda *a, **k: Part.unmeasured("network", "the tests' x/2"))


# --- the widest plateau --------------------------------------------------------------------------------------------

def test_a_flat_curves_answer_is_the_middle_of_its_widest_plateau_not_its_razor_edge_minimum():
    xs = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    ys = [10.0, 9.00, 10.0, 9.08, 9.05, 9.06, 9.07, 9.02, 10.0]
    # within 1 % of the least (9.00): y <= 9.09 at x = 2 (the razor edge) and x = 8 .. 128 (a plateau of 4 octaves);
    # the plateau's middle in log scale is sqrt(8 x 128) = 32.
    assert widest_plateau(xs, ys, 0.01) == (3, 7, 5)
    # With no tolerance only the least point is inside: the answer is the minimum itself.
    assert widest_plateau(xs, ys, 0.0) == (1, 1, 1)
    # A tolerance that holds everything: the whole curve, middle sqrt(1 x 256) = 16.
    assert widest_plateau(xs, ys, 0.2) == (0, 8, 4)


def test_plateau_ties_go_to_the_lower_time_and_to_the_run_holding_the_least():
    # two points equally far (log scale) from the middle of 10 .. 20: the faster one
    assert widest_plateau([10, 20], [1.02, 1.01], 0.01) == (0, 1, 1)
    # two runs of one octave each: the one holding the least; the pick is a tie in log scale, to the faster
    assert widest_plateau([1, 2, 4, 8, 16], [1.001, 1.002, 2.0, 1.0, 1.003], 0.01) == (3, 4, 3)
    assert widest_plateau([1, 2, 4, 8, 16], [1.0, 1.002, 2.0, 1.001, 1.003], 0.01) == (0, 1, 0)
    # `least` from elsewhere (a profile): only points within its tolerance count
    assert widest_plateau([1, 2, 4], [1.5, 1.004, 1.2], 0.01, least=1.0) == (1, 1, 1)


@pytest.mark.parametrize("xs, ys", [([], []), ([2, 1], [1, 1]), ([0, 1], [1, 1]), ([1, 2], [1])])
def test_plateau_refuses_curves_it_cannot_read(xs, ys):
    with pytest.raises(ConfigError):
        widest_plateau(xs, ys, 0.01)


def test_generic_threshold_search_recommends_its_plateau():
    # T(M) = 1 s: one bucket (any threshold above 3 MB, up to the model's 4 MB) is best, 1.008 s
    r = tune(make_experiment(TRACE, alpha=1.0, beta=0.0))
    lo, hi = r.plateau_bytes
    assert 3e6 < lo and hi == 4e6 and lo <= r.recommended_threshold_bytes <= hi
    assert r.recommended_iteration_time_s == pytest.approx(1.008, rel=1e-12)


def test_generic_search_says_which_framework_defaults_the_model_tells_from_the_best():
    # T(M) = 1 s: one bucket (1.008 s) is best. DDP's default runs two allreduces (2.006 s): twice as slow whatever
    # the unmeasured parts (x/2) do to both runs. BAGUA's 10 MiB default holds the whole model: the same plan, a
    # ratio of exactly 1, which no model error moves.
    r = tune(make_experiment(TRACE, alpha=1.0, beta=0.0))
    assert r.versus_defaults["ddp"].value == pytest.approx(2.006 / 1.008, rel=1e-9)
    assert r.distinct("ddp") is True and r.versus_defaults["ddp"].lo > 1.9
    iv = r.versus_defaults["bagua"]
    assert (iv.value, iv.lo, iv.hi) == (1.0, 1.0, 1.0) and r.distinct("bagua") is False
    assert r.distinct("wfbp") is None and set(r.versus_defaults) == {"ddp", "horovod", "bagua"}
    table = r.table().set_index("policy")
    assert table.distinct["ddp"] is True and table.distinct["bagua"] is False and table.distinct["wfbp"] is None


def test_generic_search_gives_the_best_runs_interval():
    # the best threshold's run, simulated with its interval as `simfog.simulate(..., level=)` gives it
    exp = make_experiment(TRACE, alpha=1.0, beta=0.0)
    r = tune(exp, level=0.8)
    best = simfog.simulate(exp.with_comm(merge="threshold", threshold_bytes=r.best_threshold_bytes),
                           level=0.8).summary()
    assert r.best_interval == {k: best[k] for k in ("iteration_time_lo_s", "iteration_time_hi_s", "samples_per_s",
                                                    "samples_per_s_lo", "samples_per_s_hi", "interval_level")}
    assert r.best_interval["iteration_time_lo_s"] < r.best_iteration_time_s < r.best_interval["iteration_time_hi_s"]
    assert r.best_interval["interval_level"] == 0.8


# --- DDP, Horovod, BAGUA -------------------------------------------------------------------------------------------

def test_ddp_latency_bound_sets_bucket_cap_mb_and_warns_about_the_first_bucket():
    # T(M) = 1 s. DDP's default closes a 1 MiB first bucket after two gradients (2 MB >= 1 MiB), the rest in the
    # 25 MiB bucket: 2 allreduces, 4 ms forward + 2 ms + 2 x 1 s = 2.006 s. An explicit bucket_cap_mb makes both
    # caps that size: one bucket (1.008 s) from 3 MiB (> 3 MB) up; 3, 5 and 25 MiB form the plateau, whose middle
    # in log scale, sqrt(3 x 25) = 8.7, is nearest 5.
    r = tune_framework(make_experiment(TRACE, alpha=1.0, beta=0.0), "ddp")
    assert [k.name for k in r.knobs] == ["bucket_cap_mb"]
    assert list(r.settings.bucket_cap_mb.dropna()) == [0.7, 1, 1.5, 2, 3, 5, 25]
    assert r.default["iteration_time_s"] == pytest.approx(2.006, rel=1e-12) and r.default["buckets"] == 2
    assert not r.keep_default
    assert r.plateau == {"bucket_cap_mb": (3.0, 25.0)}
    assert r.choice["bucket_cap_mb"] == 5 and r.choice["iteration_time_s"] == pytest.approx(1.008, rel=1e-12)
    assert r.setting == "DDP(model, bucket_cap_mb=5)"
    assert r.gain == pytest.approx(1 - 1.008 / 2.006, rel=1e-9)
    assert "first bucket" in r.notes[0] and "1008 ms against 2006 ms" in r.notes[0]


def test_ddp_default_kept_within_the_tolerance():
    # T(M) = 10 ns/B: every gradient alone (bucket_cap_mb 0.7) keeps the stream busy from 1 ms into backward:
    # 4 + 1 + 4 x 10 = 45 ms. The default (2 + 2 gradients): 4 + 2 + 20 + 20 = 46 ms, 2.2 % slower.
    exp = make_experiment(TRACE, alpha=0.0, beta=1e-8)
    r = tune_framework(exp, "ddp", tolerance=0.03)
    assert r.best["iteration_time_s"] == pytest.approx(0.045, rel=1e-9)
    assert r.default["iteration_time_s"] == pytest.approx(0.046, rel=1e-9)
    assert r.keep_default and r.choice == r.default and r.gain == 0
    assert r.setting.startswith("DDP(model)") and r.gain_interval is None
    # At 1 % the change (0.7 MiB, 2.2 % faster) passes the tolerance but not the model's uncertainty. The trace has
    # one sample and the links are α-β: both parts unmeasured, x/2 each, moved through both runs at once. Network
    # x2 (20 ns/B): 4 + 1 + 4 x 20 = 85 ms against 4 + 2 + 40 + 40 = 86; network /2: 4 + 1 + 4 x 5 = 25 against
    # 4 + max(2 + 10, 4) + 10 = 26. Compute x2 (gradients at 2, 4, 6, 8 ms of an 8 ms forward): 8 + 2 + 40 = 50
    # against 8 + 4 + 20 + 20 = 52; compute /2: 2 + 0.5 + 40 = 42.5 against 2 + 1 + 20 + 20 = 43. Ratio 46/45;
    # each part lowers it to 86/85 (43/42.5 alike) and raises it to 26/25 (52/50): lo = 46/45 · exp(-√2 ·
    # ln((46/45)/(86/85))) = 1.0075, under 1.01: keep. With no tolerance, 1.0075 > 1: change.
    r = tune_framework(exp, "ddp", tolerance=0.01)
    ratio, down, up = 46 / 45, math.log((46 / 45) / (86 / 85)), math.log((26 / 25) / (46 / 45))
    iv = r.gain_interval
    assert iv.value == pytest.approx(ratio, rel=1e-9)
    assert [(p.name, p.measured) for p in iv.parts] == [("compute", False), ("network", False), ("run-to-run", True)]
    assert [p.below for p in iv.parts] == pytest.approx([down, down, 0.0], rel=1e-9)
    assert [p.above for p in iv.parts] == pytest.approx([up, up, 0.0], rel=1e-9)
    assert "does not move with its seed" in iv.parts[2].source  # mean layer times: nothing drawn at random
    assert iv.lo == pytest.approx(ratio * math.exp(-math.sqrt(2) * down), rel=1e-9)
    assert iv.lo == pytest.approx(1.0075, abs=1e-4)
    assert r.keep_default and "not sure to exceed the 1 % tolerance at 90 %" in r.keep_reason
    r = tune_framework(exp, "ddp", tolerance=0.0)
    assert not r.keep_default and r.keep_reason == "" and r.setting == "DDP(model, bucket_cap_mb=0.7)"
    # unmeasured parts take the stated x/2 at any level: the level is carried, the answer the same
    r = tune_framework(exp, "ddp", tolerance=0.01, level=0.5)
    assert r.gain_interval.level == 0.5 and r.gain_interval.lo == pytest.approx(iv.lo, rel=1e-12) and r.keep_default


def test_ratio_of_a_run_to_itself_is_one_whatever_the_model_error():
    # the same model error moves both runs alike: the interval of t / t is [1, 1], whatever the parts' widths
    exp = make_experiment(TRACE, alpha=0.0, beta=1e-8)
    iv = ratio_interval(exp, exp)
    assert (iv.value, iv.lo, iv.hi) == (1.0, 1.0, 1.0)
    assert {p.name for p in iv.parts} == {"compute", "network", "run-to-run"}
    with pytest.raises(ConfigError, match="level"):
        ratio_interval(exp, exp, level=1.5)


def test_horovod_changes_one_knob_when_that_reaches_the_tolerance():
    # T(M) = 1 s. Horovod's cycles tick from the iteration's start; gradients are ready at 5..8 ms. With a 1 ms
    # cycle the 5 ms tick takes the first gradient alone, the rest go a second later: 2 buckets, ~2.005 s, whatever
    # the fusion threshold. A 10 ms cycle finds all four ready: one bucket, 1.010 s; 20 ms: 1.020 s (within 1 %).
    # So the threshold stays, the cycle time moves to the middle of 10 .. 20, a tie in log scale, to the faster.
    # The trace's 20 samples, each layer 1 ms ± 1 %, measure the compute part (x/1.01 at 90 %): gradients stay
    # inside the 10 ms tick, so the model vouches for the change (the network, unmeasured x/2, moves both runs'
    # second-long allreduces alike).
    samples = [([0.001 * (1 + (-1) ** i * 0.01)] * 4,) * 2 for i in range(20)]
    measured = make_trace([0.001] * 4, [0.001] * 4, [250_000] * 4, samples=samples)
    r = tune_framework(make_experiment(measured, alpha=1.0, beta=0.0), "horovod")
    assert [k.name for k in r.knobs] == ["HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"]
    assert r.default["HOROVOD_FUSION_THRESHOLD"] == 128 * MiB and r.default["HOROVOD_CYCLE_TIME"] == 1
    assert r.best["iteration_time_s"] == pytest.approx(1.010, rel=1e-9)
    assert r.plateau == {"HOROVOD_CYCLE_TIME": (10.0, 20.0)}
    assert r.choice["HOROVOD_CYCLE_TIME"] == 10 and r.choice["HOROVOD_FUSION_THRESHOLD"] == 128 * MiB
    assert r.setting == "HOROVOD_CYCLE_TIME=10"
    assert [p.measured for p in r.gain_interval.parts] == [True, False, True] and r.gain_interval.lo > 1.9
    # A trace of one sample leaves the compute unmeasured (x/2): at twice the compute the gradients are ready at
    # 10..16 ms, the 10 ms tick takes the first alone and the change gains nothing (ratio 1 at that bound). The
    # model cannot vouch for a cycle time fitted to compute it never measured: keep the default.
    r = tune_framework(make_experiment(TRACE, alpha=1.0, beta=0.0), "horovod")
    assert r.keep_default and "model's uncertainty" in r.keep_reason
    assert r.gain_interval.lo == pytest.approx(1.0, abs=1e-3) and r.gain_interval.value > 1.9


def test_bagua_bucket_size_in_bytes():
    # T(M) = 1 s: BAGUA's 10 MiB default holds the whole 4 MB model (one bucket, 1.008 s): keep it.
    r = tune_framework(make_experiment(TRACE, alpha=1.0, beta=0.0), "bagua")
    assert r.default["BAGUA_DEFAULT_BUCKET_SIZE"] == 10 * MiB
    assert r.keep_default and r.default["iteration_time_s"] == pytest.approx(1.008, rel=1e-12)
    # T(M) = 10 ns/B: every gradient alone is best, the smallest bucket size in the series (0.7 MiB, in bytes).
    r = tune_framework(make_experiment(TRACE, alpha=0.0, beta=1e-8), "bagua")
    assert r.setting == f"BAGUA_DEFAULT_BUCKET_SIZE={round(0.7 * MiB)}"


def test_knob_grids_include_the_defaults_and_span_the_model():
    ddp, = knobs_of("ddp", 1000, 100 * MiB)
    assert 25 in ddp.values and min(ddp.values) <= 1000 / MiB and max(ddp.values) >= 100
    fusion, cycle = knobs_of("horovod", 1000, 100 * MiB)
    assert 128 * MiB in fusion.values and all(v == 2 ** round(math.log2(v)) for v in fusion.values)
    assert 1 in cycle.values
    with pytest.raises(ConfigError):
        knobs_of("wfbp", 1000, 100 * MiB)
    with pytest.raises(ConfigError, match="tolerance"):
        tune_framework(make_experiment(TRACE), "ddp", tolerance=1.5)


def test_sharded_recommendation_in_fsdp2_spelling():
    # T(M) = 1 s: one unit, kept after forward, is best (2.008 s; FSDP2's defaults 12.001 s; see test_tune_sharded).
    r = tune_sharded(make_experiment(TRACE, algorithm="fsdp", alpha=1.0, beta=0.0))
    choice, keep = r.recommend(0.01)
    assert not keep and choice["fsdp_unit"] == "model" and choice["reshard_after_forward"] is False
    assert r.spelling(choice) == ["fully_shard(model) alone (one unit)",
                                  "fully_shard(..., reshard_after_forward=False)"]
    # a tolerance wide enough to hold the defaults keeps them
    assert r.recommend(5.0) == (r.default, True)
    # weighed against the model's uncertainty (both parts unmeasured, x/2 moved through both runs): 12 allreduces
    # against 2 of a second each, whatever the compute or the network do to both; the change stands
    setting, keep, reason, iv = r.weigh(0.01)
    assert (setting, keep, reason) == (choice, False, "")
    assert iv.value == pytest.approx(12.001 / 2.008, rel=1e-9) and iv.lo > 5
    assert r.weigh(5.0) == (r.default, True, "within the 500 % tolerance of the best", None)


# --- the command line ----------------------------------------------------------------------------------------------

EXP = """
iterations = 2
[workload]
trace = "t.json"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
collective = "linear"
alpha = "1s"
beta = "0ns/B"
"""


def test_cli_tunes_ddp_and_ends_with_the_setting(tmp_path, capsys):
    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    prefix = tmp_path / "ddp" / "tune"
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--merge", "ddp", "-o", str(prefix.parent)]) == 0
    out = capsys.readouterr().out
    answer = [line for line in out.splitlines() if line.startswith("answer:")]
    assert answer and answer[0].startswith("answer: DDP(model, bucket_cap_mb=5)")
    assert "2.01 s -> 1.01 s" in answer[0]  # 2.006 s with DDP's default, 1.008 s in one bucket
    assert "49.8 % (90 %: " in answer[0]  # 1 - 1.008/2.006, with the interval the model vouches for
    assert "tolerance 1 %" in out and "first bucket" in out
    rows = list(csv.DictReader(open(f"{prefix}.csv")))
    assert {"bucket_cap_mb", "iteration_time_s", "default"} <= set(rows[0]) and len(rows) == 8
    assert (tmp_path / "ddp" / "tune.png").read_bytes()[:4] == b"\x89PNG"
    # the default is 99.0 % slower than one bucket: a 99.5 % tolerance keeps it
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--merge", "ddp", "--tolerance", "99.5", "--json",
                     "-o", str(tmp_path / "j")]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["keep_default"] and j["setting"].startswith("DDP(model)") and j["tolerance"] == 0.995
    assert "within the 99.5 % tolerance" in j["keep_reason"] and "choice_gain" not in j
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--merge", "ddp", "--json", "-o", str(tmp_path / "k")]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["choice_gain_lo"] < j["choice_gain"] < j["choice_gain_hi"] and j["interval_level"] == 0.9
    assert j["choice_gain"] == pytest.approx(1 - 1.008 / 2.006, rel=1e-9) and not j["keep_default"]
    assert set(j["gain_interval_parts"]) == {"compute", "network", "run-to-run"}


def test_cli_sharded_framework_by_merge(tmp_path, capsys):
    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    assert cli.main(["tune", str(tmp_path / "e.toml"), "--merge", "fsdp", "-o", str(tmp_path / "f")]) == 0
    out = capsys.readouterr().out
    assert "answer (iteration" in out and "reshard_after_forward=False" in out


@pytest.mark.parametrize("argv, flag", [(["--merge", "wfbp"], "--merge"), (["--tolerance", "150"], "--tolerance"),
                                        (["--merge", "ddp", "--points", "5"], "--points"),
                                        (["--threshold", "1MiB"], "--threshold"),
                                        (["--merge", "ddp", "--level", "2"], "--level")])
def test_cli_refuses(tmp_path, capsys, argv, flag):
    TRACE.save(tmp_path / "t.json")
    (tmp_path / "e.toml").write_text(EXP)
    assert cli.main(["tune", str(tmp_path / "e.toml"), *argv, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_gain_interval_that_ends_at_its_gain_says_why_where_it_is_printed():
    """'saves 2.8 % (90 %: -31.7 to 2.8 %)' reads as a bug unless the line says why the interval ends at its point:
    a part whose both bounds narrow the gap has no width above (simfog.bands.effect), so the interval ends there."""
    from simfog.bands import Part, combine, effect
    from simfog.commands.tune import _gain_line

    compute = effect("compute", 1.05, 1.01, 0.9, "roofline")  # both bounds lower the ratio default / change
    assert compute.above == 0
    ends = combine(1.05, 0.9, [compute])
    text = "\n".join(_gain_line(ends))
    # gain 1 - 1/1.05 = 4.8 %; its low from the lower bound, ratio 0.9: 1 - 1/0.9 = -11.1 %; its high the gain
    assert "saves 4.8 % (90 %: -11.1 to 4.8 %)" in text
    assert "the interval ends at 4.8 %, the gain itself: each part's error, moved to either of its bounds in both " \
           "runs at once, only narrows the gap" in text
    both = combine(1.05, 0.9, [Part("compute", 0.1, 0.05, "roofline")])  # a width on each side: nothing to explain
    assert len(_gain_line(both)) == 1 and "ends at" not in _gain_line(both)[0]
