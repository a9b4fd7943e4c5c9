"""A typo gets the answer, not only the list: unknown keys, enum values and command-line flags name the nearest
allowed one in one extra phrase, and nothing else in the message changes."""

from __future__ import annotations

import pytest

from simfog import cli, experiment
from simfog.errors import ConfigError, did_you_mean, one_of, unknown_key

from .conftest import make_trace

EXP = """
[workload]
trace = "t.json"
[cluster]
nodes = 2
gpus_per_node = 2
nic_bandwidth = "10Gbit/s"
[comm]
merge = "ddp"
"""


@pytest.fixture
def folder(tmp_path):
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 500_000]).save(tmp_path / "t.json")
    return tmp_path


def _error(folder, old: str, new: str) -> str:
    path = folder / "exp.toml"
    path.write_text(EXP.replace(old, new))
    with pytest.raises(ConfigError) as e:
        experiment.load(path)
    return str(e.value)


def test_a_misspelt_key_names_the_key_meant_and_keeps_the_list(folder):
    near = _error(folder, "nic_bandwidth", "nic_bandwith")
    far = _error(folder, "nic_bandwidth", "zzz_qqq")
    assert "not a known key (did you mean 'nic_bandwidth'?); allowed: " in near
    # the same message but for the key and the one phrase
    assert near.replace(" (did you mean 'nic_bandwidth'?)", "").replace("nic_bandwith", "zzz_qqq") == far
    assert "did you mean" not in far


def test_an_enum_value_in_the_wrong_case_names_the_right_one(folder):
    msg = _error(folder, 'merge = "ddp"', 'merge = "DDP"')
    assert msg.endswith("(did you mean 'ddp'?)"), msg
    assert msg.startswith(f"{folder / 'exp.toml'}: comm.merge = 'DDP': one of ")
    assert "ddp, " in msg  # the list is still there
    assert "did you mean 'ring'" in _error(folder, 'merge = "ddp"', 'merge = "ddp"\ncollective = "rnig"')
    assert "did you mean 'mean'" in _error(folder, "[cluster]", 'compute = "maen"\n[cluster]')


@pytest.mark.parametrize("value, choices, hint", [
    ("DDP", ["ddp", "horovod"], " (did you mean 'ddp'?)"),
    ("nic-bandwidth", ["nic_bandwidth"], " (did you mean 'nic_bandwidth'?)"),
    ("gpus_per_nod", ["gpus_per_node", "nodes"], " (did you mean 'gpus_per_node'?)"),
    ("ddp", ["ddp"], ""),            # the value itself: nothing to suggest
    ("xyzzy", ["ddp", "ring"], ""),  # nothing near
    (3, ["ddp"], ""),                # not a name
])
def test_did_you_mean(value, choices, hint):
    assert did_you_mean(value, choices) == hint


def test_one_of_and_unknown_key_add_only_the_phrase():
    assert one_of("Ring", ["ring", "tree"]) == "one of ring, tree (did you mean 'ring'?)"
    assert one_of("x", ["ring", "tree"]) == "one of ring, tree"
    assert unknown_key("nodez", ["nodes", "seed"]) == "not a known key (did you mean 'nodes'?); allowed: nodes, seed"


@pytest.mark.parametrize("argv, hint", [
    (["simulate", "--iteratons", "2"], "--iterations"),  # a misspelling
    (["plan", "--ranks", "8"], "--gpus"),                # the same idea under this command's name
    (["plan", "--rank=8"], "--gpus"),
    (["tune", "--treshold", "1MiB"], "--threshold"),
])
def test_an_unknown_flag_names_the_nearest_flag_of_its_command(argv, hint, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    bad = next(a for a in argv if a.startswith("--")).split("=")[0]
    assert err.endswith(f"unrecognized arguments: {next(a for a in argv if a.startswith(bad))} (did you mean "
                        f"{hint}?) (see simfog --help)"), err


def test_an_unknown_flag_with_nothing_near_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--zzzzzz"])
    assert capsys.readouterr().err.strip() == "simfog: error: unrecognized arguments: --zzzzzz (see simfog --help)"
