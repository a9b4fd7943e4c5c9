"""Malformed inputs through the `simfog` command (issue 11, "zero tracebacks"): each ends with exit code 2 and one
line on stderr naming the file or option at fault, no traceback, nothing written.

The inputs come from bench/fuzz.py's families (mutations of traces/, notebooks/experiments, the embedded default
experiment and catalogue, bench/data/ref logs, bad options, non-regular files, bad output paths); hypothesis picks
families and seeds, derandomized so CI sees the same inputs every run. The CLI runs in-process through
simfog.cli.main; a few cases that need a real process (Ctrl-C, a FIFO) run as subprocesses.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simfog import cli

from .conftest import REPO

_spec = importlib.util.spec_from_file_location("simfog_bench_fuzz", REPO / "bench" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fuzz  # dataclasses look their module up there
_spec.loader.exec_module(fuzz)

FAMILIES = sorted(fuzz.FAMILIES)
EXAMPLES = 1200


def _check(case, outcome):
    assert outcome.kind in ("clean", "ok"), (f"simfog {' '.join(case.argv)} -> {outcome.kind}: {outcome.detail}\n"
                                             f"{outcome.stderr}")


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**32 - 1))
def test_malformed_inputs_give_one_clean_line_and_exit_2(family, seed):
    with tempfile.TemporaryDirectory(prefix="simfog-fuzz-") as base:
        d = Path(base)
        case = fuzz.make_case(family, seed, d)
        _check(case, fuzz.run_case(case, d, timeout=60))


# The signatures issue 11 lists, one each, so that a regression names itself.
def _trace(d: Path, change=None) -> str:
    t = json.loads(json.dumps(fuzz.corpus()["model"][0]))
    if change:
        change(t)
    (d / "t.json").write_text(json.dumps(t))
    return "t.json"


def _exp(d: Path, **top) -> str:
    e = json.loads(json.dumps(fuzz.corpus()["exps"][0]))
    e.update(top)
    (d / "e.toml").write_text(fuzz.dump_toml(e))
    return "e.toml"


def _no_params(t):
    for layer in t["layers"]:
        layer["params"] = []
    t["grad_ready_order"] = []


def _set_time(value):
    return lambda t: t["layers"][0]["forward_s"].__setitem__(0, value)


def _huge_elements(t):
    next(layer for layer in t["layers"] if layer["params"])["params"][0]["elements"] = 10**400


def _net(d: Path, times) -> str:
    t = json.loads(json.dumps(fuzz.corpus()["net"][0]))
    for m in t["measurements"]:
        m["time_s"] = [times] * len(m["time_s"])
    (d / "n.json").write_text(json.dumps(t))
    return "n.json"


SIGNATURES = {
    "gzip trace as experiment": lambda d: (["simulate", str(REPO / "traces" / "mlp-cpu-b1024.json.gz")], "json.gz"),
    "binary experiment": lambda d: ((d / "b.toml").write_bytes(b"\xff\xfe\x00\x01"), ["simulate", "b.toml"])[1:]
    + ("b.toml",),
    "directory as experiment": lambda d: (["simulate", str(d)], str(d)),
    "/dev/zero as experiment": lambda d: (["simulate", "/dev/zero"], "/dev/zero"),
    "/dev/zero as import": lambda d: (["import", "kineto", "/dev/zero", "-o", "o.json"], "/dev/zero"),
    "trace without parameters": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d, _no_params)})],
                                           "t.json"),
    "NaN layer time": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d, _set_time(float("nan")))})],
                                 "forward_s"),
    "1e308 layer time": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d, _set_time(1e308))})],
                                   "forward_s"),
    "400-digit elements": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d, _huge_elements)})],
                                     "elements"),
    "400-digit seed": lambda d: (["simulate", _exp(d, seed=10**400, workload={"trace": _trace(d)})], "seed"),
    "JSON nested 100,000 deep": lambda d: ((d / "t.json").write_text("[" * 100_000 + "]" * 100_000),
                                           ["simulate", _exp(d, workload={"trace": "t.json"})], "t.json")[1:],
    "calibrate all-equal times": lambda d: (["calibrate", _net(d, 1.0)], "n.json"),
    "calibrate denormal times": lambda d: (["calibrate", _net(d, 5e-324)], "n.json"),
    "--seed -1": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d)}), "--seed", "-1"], "--seed"),
    "--iterations 1e8": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d)}), "--iterations", "1e8"],
                                   "--iterations"),
    "--iterations 100000000": lambda d: (["simulate", _exp(d, workload={"trace": _trace(d)}), "--iterations",
                                          "100000000"], "--iterations"),
    "output parent is a file": lambda d: ((d / "f").write_text("x"), ["simulate", _exp(d, workload={
        "trace": _trace(d)}), "--intervals", "f/x.csv"], "f/x.csv")[1:],
    "output is a directory": lambda d: ((d / "o").mkdir(), ["sweep", _exp(d, workload={"trace": _trace(d)}), "-o",
                                                            "o", "--jobs", "1"], "'o'")[1:],
    "curve --ranks ''": lambda d: (["curve", _exp(d, workload={"trace": _trace(d)}), "--ranks", ""], "--ranks"),
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_issue_signatures_give_one_clean_line(name, tmp_path):
    argv, needle = SIGNATURES[name](tmp_path)
    case = fuzz.Case("signature", argv, (needle,))
    _check(case, fuzz.run_case(case, tmp_path, timeout=60))


def test_ctrl_c_while_starting_up_exits_130_with_one_line(monkeypatch, capsys):
    def interrupted(name, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)  # Ctrl-C while the commands are imported
    assert cli.main(["simulate"]) == 130
    assert capsys.readouterr().err == "simfog: interrupted\n"


def _unblock_sigint() -> None:
    # A child inherits its parent's ignored and blocked signals. Some test before these leaves SIGINT ignored or
    # blocked in pytest's process now and then (not found yet); a child started from a shell has it open, as these
    # must.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _subprocess(argv, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "simfog.cli", *argv], cwd=kw.pop("cwd", None), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_unblock_sigint,
                            **kw)


def test_sigint_during_a_run_exits_130_without_traceback(tmp_path):
    # Horovod's fusion cycles run on the event engine: the embedded default at the most iterations its 32 ranks are
    # allowed takes seconds (~3.5 s here), not the analytic path's ~1 s. SIGINT once the process has started its work.
    p = _subprocess(["simulate", "--merge", "horovod", "--iterations", "31000"], cwd=tmp_path)
    try:
        out, err = p.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode in (130, 2), err   # 2 if the bound refused the run before the signal came
    assert "Traceback" not in err and len(err.splitlines()) == 1, err


def test_fifo_input_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "e.toml")
    p = _subprocess(["simulate", "e.toml"], cwd=tmp_path)
    out, err = p.communicate(timeout=60)   # a read would block for ever: nobody writes the FIFO
    assert p.returncode == 2 and err.count("\n") == 1 and "e.toml" in err and "FIFO" in err, err


def test_ctrl_c_that_a_simulated_process_catches_still_stops_the_run():
    """Ctrl-C swallowed where it landed (a destructor, a process SimPy resumed inside `except BaseException`) is
    noted all the same (simfog.interrupts), and the event loop stops on the note at its first check; outside the
    command line's block nothing is noted and the handler is Python's."""
    import simpy

    from simfog import interrupts
    from simfog.engine.ranks import run_events

    def ticking(env):
        while True:
            yield env.timeout(1.0)

    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])  # see _unblock_sigint
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has it
    with interrupts.handled():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        env = simpy.Environment()
        env.process(ticking(env))
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:  # delivered here, in the test's frame, but noted
            pass
        assert interrupts.requested()
        with pytest.raises(KeyboardInterrupt):
            run_events(env)  # would never end: the request stops it at the first check
        assert 0xFFFF <= env.now < 0x10000 + 1  # the first check, after 65,536 events (the first starts the process)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupts.requested()
    signal.signal(signal.SIGINT, before)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
