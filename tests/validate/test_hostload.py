"""validate.cluster.hostload: a run where more tasks wanted a core than the machine has is flagged host-limited, from
/proc/stat samples (written by hand here), per time window; and the bench's verdict reports such rows apart."""

from __future__ import annotations

import pytest

from validate.bench import verdict
from validate.cluster.hostload import HOST_BUSY_LIMIT, HOST_LIMITED_FRACTION, HostLoad, HostSampler, read_stat
from validate.comparison import compare


def _stat(tmp_path, running: int, idle: int, total_busy: int):
    p = tmp_path / "stat"
    p.write_text(f"cpu  {total_busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\nintr 5\n"
                 f"procs_running {running}\nprocs_blocked 0\n")
    return p


def test_read_stat(tmp_path):
    assert read_stat(str(_stat(tmp_path, 3, 70, 30))) == (3, (70, 100))


def test_windows_and_the_limit(tmp_path):
    s = HostSampler(stat_path=str(_stat(tmp_path, 1, 0, 0)))
    s.cores = 2
    # (t, runnable without the sampler, idle jiffies, total jiffies): 4 samples at 1.0..1.3 s, 3 of them with
    # 3 runnable tasks on 2 cores; the CPUs were busy 60 of the 100 jiffies between the first and the last
    s.samples = [(1.0, 3, 0, 0), (1.1, 3, 10, 50), (1.2, 1, 20, 70), (1.3, 3, 40, 100)]
    whole = s.load()
    assert (whole.samples, whole.oversubscribed, whole.runnable) == (4, 0.75, 2.5)
    assert whole.busy == pytest.approx(0.6) and whole.limited  # most samples over the cores
    quiet = s.load(1.15, 1.25)
    assert (quiet.samples, quiet.oversubscribed, quiet.limited) == (1, 0.0, False)
    assert not HostLoad(0.5, 1.0, HOST_LIMITED_FRACTION, 10, 2).limited  # at the limit: not over it
    assert HostLoad(HOST_BUSY_LIMIT, 1.0, 0.0, 10, 2).limited            # saturated CPUs, few samples over


def test_sampler_runs_on_this_machine():
    with HostSampler(every_s=0.005) as s:
        sum(i * i for i in range(200_000))
    load = s.load()
    assert load.samples >= 2 and 0.0 <= load.busy <= 1.0 and load.cores >= 1


def _row(vid, err, limited):
    return {"id": vid, "rel_error": err, "host_limited": limited, "host_oversubscribed": 0.9 if limited else 0.0,
            "host_cpu_busy": 0.5}


def test_verdict_reports_host_limited_rows_apart():
    rows = [_row("a", 0.02, False), _row("b", -0.04, False), _row("c", -0.41, True)]
    text = verdict(rows)
    assert "MET (median 3.0%, worst 4.0% over 2 rows the rig can emulate)" in text
    assert "host-limited, reported apart: 1 rows, median 41.0%, worst 41.0% (c)" in text
    assert compare.host_limited({"host_limited": "True"}) and not compare.host_limited({"host_limited": ""})
    # the criterion is applied to the row's samples, not to the flag an older criterion wrote
    assert compare.host_limited({"host_limited": "False", "host_cpu_busy": "0.95", "host_oversubscribed": "0.1"})


def test_repeat_summary_spread_and_per_run_verdicts():
    from validate.bench import repeat_summary

    run1 = [{**_row("a", 0.02, False), "measured_iteration_s": 0.100},
            {**_row("b", -0.30, True), "measured_iteration_s": 0.200}]
    run2 = [{**_row("a", -0.02, False), "measured_iteration_s": 0.110},
            {"id": "b", "error": "launch failed"}]
    text = repeat_summary([run1, run2]).splitlines()
    a = next(line for line in text if line.startswith("a "))
    assert "+2.0%" in a and "-2.0%" in a and "9.5%" in a  # (0.110 - 0.100) / 0.105
    b = next(line for line in text if line.startswith("b "))
    assert "-30.0%" in b and b.rstrip().endswith("1") and " - " in b.replace("       -", " - ")
    assert any(line.startswith("run 2: target median <= 5%") for line in text)


def test_steal_is_the_hypervisors_share_of_the_window(tmp_path):
    from validate.cluster.hostload import _read

    p = tmp_path / "stat"
    p.write_text("cpu  10 0 20 60 5 0 0 5 0 0\nprocs_running 2\n")  # user nice system idle iowait irq softirq steal
    assert _read(str(p)) == (2, 65, 100, 5)
    s = HostSampler(stat_path=str(p))
    # (t, runnable, idle, total, steal): 12 of the 200 jiffies between the first and last sample were stolen
    s.samples = [(1.0, 1, 0, 0, 3), (1.1, 1, 50, 100, 9), (1.2, 1, 100, 200, 15)]
    load = s.load()
    assert load.steal == pytest.approx(0.06) and load.row()["host_steal"] == pytest.approx(0.06)
    assert s.load(1.05, 1.15).steal == 0.0  # one sample: no window


def test_fingerprint_names_the_machine(tmp_path):
    from validate.cluster.fingerprint import HostFingerprint, cpu_model, fingerprint, microbenchmark_s

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7V12 64-Core Processor\n")
    assert cpu_model(str(info)) == "AMD EPYC 7V12 64-Core Processor"
    assert cpu_model(str(tmp_path / "absent")) != ""  # the platform's answer where /proc is missing
    short, long = microbenchmark_s(n=20_000, runs=3), microbenchmark_s(n=400_000, runs=3)
    assert 0 < short < long  # the same loop, 20 times the steps: the machine's time per step shows
    f = fingerprint()
    assert f is fingerprint() and f.cores >= 1 and f.microbenchmark_s > 0  # measured once per process
    row = HostFingerprint("X", 2, "6.1", 0.05).row()
    assert row == {"host_cpu_model": "X", "host_cores": 2, "host_kernel": "6.1", "host_microbenchmark_s": 0.05}
    assert "50.0 ms" in HostFingerprint("X", 2, "6.1", 0.05).describe()


def test_tests_that_time_real_processes_skip_their_timing_on_a_host_limited_host():
    """The rule the validator reports rows apart by is the one the real-process tests skip their timing by
    (tests/validate/conftest.py): CSV rows (strings) and run rows alike; a free host's rows go on to be timed."""
    from .conftest import skip_timing_if_host_limited

    skip_timing_if_host_limited(_row("a", 0.02, False), {"id": "b", "host_cpu_busy": "0.5",
                                                          "host_oversubscribed": "0.1"})
    with pytest.raises(pytest.skip.Exception, match=r"HOST-LIMITED \(c; CPUs 50% busy\)"):
        skip_timing_if_host_limited(_row("a", 0.02, False), _row("c", 0.9, True))
    with pytest.raises(pytest.skip.Exception, match=r"HOST-LIMITED \(d; CPUs 95% busy\)"):
        skip_timing_if_host_limited({"id": "d", "host_cpu_busy": "0.95", "host_oversubscribed": "0.0"})
