"""One place per rule (issue 24 point 4): the families' settings dataclasses, the one [comm] reader and
`override` that the experiment file, the command line, the Python API, sweep and plan share, so each rule gives
the same message whichever way it is reached."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import simfog
from simfog import cli, experiment
from simfog.algorithms.allreduce.settings import AllreduceSettings
from simfog.algorithms.dataflow.settings import DataflowSettings
from simfog.algorithms.dynamic.settings import DynamicSettings
from simfog.algorithms.sharded.settings import ShardedSettings
from simfog.errors import ConfigError
from simfog.experiment import Comm, override
from simfog.plan import load_catalogue, plan, workload_experiment

from .conftest import make_trace

EXP = """
seed = 3
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
merge = "ddp"
"""
CATALOGUE = """currency = "EUR"
[[option]]
name = "eth"
gpus_per_node = 2
max_nodes = 2
intra_bandwidth = "100GB/s"
nic_bandwidth = "10Gbit/s"
price_per_gpu_hour = 1.0
"""
FAMILIES = (AllreduceSettings, ShardedSettings, DataflowSettings, DynamicSettings)


@pytest.fixture
def folder(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [1000, 2000]).save(tmp_path / "t.json")
    (tmp_path / "exp.toml").write_text(EXP)
    return tmp_path


def _error(call) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        call()
    return err.value


def _file_error(folder, old, new) -> ConfigError:
    (folder / "bad.toml").write_text(EXP.replace(old, new))
    return _error(lambda: experiment.load(folder / "bad.toml"))


def _cli_error(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 2
    return capsys.readouterr().err


def _plan_error(folder, extra) -> ConfigError:
    (folder / "cat.toml").write_text(CATALOGUE + extra)
    return _error(lambda: plan(workload_experiment(folder / "exp.toml"), load_catalogue(folder / "cat.toml"),
                               target_samples_per_s=1.0))


# ---- the dataclasses ----

@pytest.mark.parametrize("cls", [*FAMILIES, Comm])
def test_each_settings_class_is_frozen_keyword_only_and_documents_every_field(cls):
    fields = dataclasses.fields(cls)
    assert fields and all(f.kw_only for f in fields)
    assert cls.__dataclass_params__.frozen
    with pytest.raises(TypeError):
        cls("x")  # keyword-only: no positional construction
    source = inspect.getsource(cls)
    own = [f.name for f in fields if f.name in cls.__annotations__]
    for name in own:  # a docstring line right under each field
        after = source.split(f"    {name}:", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), (cls.__name__, name)


def test_comm_is_made_of_each_familys_settings_and_keeps_flat_reads():
    assert all(issubclass(Comm, f) for f in FAMILIES)
    c = Comm(algorithm="hsdp", hsdp_group=2, collective="ring", merge="ddp")
    assert (c.hsdp_group, c.algorithm, c.merge) == (2, "hsdp", "ddp")  # exp.comm.<field> as before
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.merge = "wfbp"


@pytest.mark.parametrize("cls, changes, field", [
    (AllreduceSettings, {"merge": "threshold"}, "comm.threshold"),
    (AllreduceSettings, {"streams": 65}, "comm.streams"),
    (ShardedSettings, {"prefetch": -1}, "comm.prefetch"),
    (ShardedSettings, {"zero_reduce": "scatter"}, "comm.zero_reduce"),
    (DataflowSettings, {"combine": "cta"}, "comm.combine"),
    (DataflowSettings, {"consensus_eps": 1.5}, "comm.consensus_eps"),
    (DynamicSettings, {"group_size": 1}, "comm.group_size"),
    (DynamicSettings, {"async_period_s": 0.0}, "comm.async_period"),
])
def test_a_familys_rule_is_checked_by_its_class_and_by_comm_alike(cls, changes, field):
    alone, within = _error(lambda: cls(**changes)), _error(lambda: Comm(**changes))
    assert alone.field == within.field == field and str(alone) == str(within)


# ---- one rule, one message, every way in ----

def test_merge_threshold_needs_a_threshold_in_one_place(folder, capsys):
    allowed = 'a size such as "25MiB" when merge = "threshold"'
    f = _file_error(folder, 'merge = "ddp"', 'merge = "threshold"')
    assert (f.field, f.allowed) == ("comm.threshold", allowed)
    assert f"--threshold = '(missing)': {allowed}" in _cli_error(capsys, "simulate", str(folder / "exp.toml"),
                                                                 "--merge", "threshold")
    a = _error(lambda: simfog.load(folder / "exp.toml", merge="threshold"))
    assert (a.field, a.allowed) == ("threshold", allowed)
    s = _error(lambda: simfog.sweep(folder / "exp.toml", merge=["ddp", "threshold"]))
    assert (s.field, s.allowed) == ("threshold", allowed)
    assert allowed in _cli_error(capsys, "sweep", str(folder / "exp.toml"), "--merge", "ddp,threshold")
    assert allowed in str(_plan_error(folder, 'merges = ["threshold"]\n'))
    assert _error(lambda: Comm(merge="threshold")).allowed == allowed


def test_a_collectives_name_is_checked_in_one_place(folder, capsys):
    f = _file_error(folder, 'collective = "ring"', 'collective = "torus"')
    assert f.field == "comm.collective" and f.allowed.startswith("one of ")
    assert f"--collective = 'torus': {f.allowed}" in _cli_error(capsys, "simulate", str(folder / "exp.toml"),
                                                                "--collective", "torus")
    assert _error(lambda: simfog.load(folder / "exp.toml", collective="torus")).allowed == f.allowed
    s = _error(lambda: simfog.sweep(folder / "exp.toml", collective=["ring", "torus"]))
    assert (s.field, s.allowed) == ("collective", f.allowed)
    p = _plan_error(folder, 'collectives = ["torus"]\n')
    assert (p.field, p.allowed) == ("option[0] (eth).collectives", f.allowed)
    assert _error(lambda: Comm(collective="torus")).allowed == f.allowed


def test_a_threshold_is_parsed_from_text_in_one_place(folder, capsys):
    f = _file_error(folder, 'merge = "ddp"', 'merge = "threshold"\nthreshold = "25"')
    assert f.field == "comm.threshold"
    assert f"--threshold = '25': {f.allowed}" in _cli_error(capsys, "simulate", str(folder / "exp.toml"),
                                                            "--threshold", "25")
    assert _error(lambda: simfog.load(folder / "exp.toml", threshold="25")).allowed == f.allowed
    assert _error(lambda: simfog.sweep(folder / "exp.toml", threshold="25")).allowed == f.allowed
    # and a good one is the same number of bytes every way
    (folder / "t25.toml").write_text(EXP.replace('merge = "ddp"', 'merge = "threshold"\nthreshold = "2.5KiB"'))
    from_file = experiment.load(folder / "t25.toml").comm
    assert from_file.threshold_bytes == 2560.0
    assert simfog.load(folder / "exp.toml", merge="threshold", threshold="2.5KiB").comm == from_file
    df = simfog.sweep(folder / "exp.toml", merge="threshold", threshold="2.5KiB")
    assert df.threshold_bytes.tolist() == [2560.0] and df.error.tolist() == [""]


def test_a_sharded_rule_reads_the_same_from_the_file_and_from_override(folder):
    f = _file_error(folder, 'merge = "ddp"', 'algorithm = "fsdp"\nprefetch = -1')
    exp = experiment.load(folder / "exp.toml")
    o = _error(lambda: override(exp, algorithm="fsdp", prefetch=-1))
    assert (o.field, o.allowed) == (f.field, f.allowed) == ("comm.prefetch", "an integer >= 0")
    # a key only some algorithms read: the same rule from both
    f = _file_error(folder, 'merge = "ddp"', "prefetch = 2")
    assert str(_error(lambda: override(exp, prefetch=2))) == str(f).replace(f"{folder / 'bad.toml'}: ", "")


# ---- override ----

def test_override_reads_keys_as_the_file_does(folder):
    exp = experiment.load(folder / "exp.toml")
    got = override(exp, ranks=8, iterations=3, seed=5, merge="threshold", threshold="4KiB", collective="rhd")
    assert (got.ranks, got.iterations, got.seed) == (8, 3, 5)
    assert (got.comm.merge, got.comm.threshold_bytes, got.comm.collective) == ("threshold", 4096.0, "rhd")
    assert override(exp, merge="threshold", threshold_bytes=4096.0).comm == override(
        exp, merge="threshold", threshold="4KiB").comm  # a Comm field in SI, or the file's key and unit
    assert exp.comm.merge == "ddp" and exp.ranks == 4  # frozen: the original is untouched
    assert override(exp) == exp


def test_override_names_the_key_as_its_caller_spells_it(folder):
    exp = experiment.load(folder / "exp.toml")
    fields = [_error(lambda s=s: override(exp, spelling=s, merge="nope")).field for s in (None, "--", "")]
    assert fields == ["comm.merge", "--merge", "merge"]
    assert _error(lambda: override(exp, spelling="--", ranks=5)).field == "--ranks"
    assert _error(lambda: override(exp, spelling="--", iterations=0)).field == "--iterations"
    assert _error(lambda: override(exp, colour="red")).field == "colour"


def test_override_checks_the_rules_that_need_the_cluster(folder):
    (folder / "h.toml").write_text(EXP.replace('merge = "ddp"', 'algorithm = "hsdp"\nhsdp_group = 2'))
    exp = experiment.load(folder / "h.toml")
    assert override(exp, ranks=8).comm.hsdp_group == 2
    assert _error(lambda: override(exp, ranks=2, hsdp_group=4)).field == "comm.hsdp_group"
