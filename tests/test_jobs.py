"""Several jobs on one fabric (simfog.jobs): the duty-cycle fixed point on a hand-worked two-job case, jobs that do
not overlap in time or share no link left alone, the timeline model's replay (two rings side by side, one job bit
for bit), bad jobs files refused by file, field and value, and `simfog simulate` of a jobs file end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from simfog import jobs
from simfog.errors import ConfigError
from simfog.fabric import cosim
from simfog.results import Result
from simfog.simulation import simulate

from .conftest import REPO, make_trace

HEAD = """
seed = 1
iterations = 3

[cluster]
nodes = 4
gpus_per_node = 1
nic_bandwidth = "1GB/s"

[fabric]
kind = "fat_tree"
nodes_per_leaf = 2
leaf_oversubscription = 2
"""
JOB = """
[[job]]
name = "{name}"
workload = "t.json"
ranks = 2
placement = {placement}
collective = "ring"
merge = "single"
"""


@pytest.fixture
def folder(tmp_path):
    # 10 + 20 ms forward, 20 + 30 ms backward, 2 ms optimizer; 4 MB of gradients
    make_trace([0.01, 0.02], [0.02, 0.03], [250_000, 750_000], optimizer=2e-3).save(tmp_path / "t.json")
    return tmp_path


def write(folder, text: str):
    path = folder / "jobs.toml"
    path.write_text(text)
    return path


def two_rings(folder, second_start: str | None = None, head: str = HEAD):
    text = head + JOB.format(name="a", placement="[0, 2]") + JOB.format(name="b", placement="[1, 3]")
    if second_start:
        text += f'start = "{second_start}"\n'
    return jobs.load(write(folder, text))


def test_two_rings_through_one_uplink_meet_at_the_hand_worked_fixed_point(folder):
    """Two leaves of two nodes, each leaf's uplinks carrying one NIC's rate (2:1). Job a runs a ring on nodes 0
    and 2, job b on 1 and 3: each crosses between the leaves with one flow each way, so alone a flow gets the NIC's
    rate B, and with the other job communicating too both share each uplink, B/2. With merge "single" an iteration
    is C (compute) + c (one allreduce), no overlap; alone c = k. Beside a job communicating a share d of its time,
    a step's β is (1 − d)·1 + d·2 = (1 + d) times the NIC's, so c = k·x with x = 1 + d. Symmetric jobs have one
    duty, d = c / (C + c) = k·x / (C + k·x): (x − 1)(C + k·x) = k·x, i.e. k·x² + (C − 2k)·x − C = 0."""
    result = jobs.run(two_rings(folder))
    a, b = result.jobs
    assert result.converged and result.rounds > 1
    k = a.duty_alone * a.alone_s
    C = a.alone_s - k
    assert k == pytest.approx(2 * 2e6 / 1e9, rel=1e-12)  # 2 steps of M/2 = 2 MB at 1 GB/s
    x = (-(C - 2 * k) + math.sqrt((C - 2 * k) ** 2 + 4 * k * C)) / (2 * k)
    for job in (a, b):
        assert job.together_s == pytest.approx(C + k * x, rel=1e-8)
        assert job.duty_together == pytest.approx(x - 1, rel=1e-8)
        assert job.slowdown == pytest.approx((C + k * x) / (C + k), rel=1e-8)
    assert 1.0 < a.slowdown < 2.0 and a.nodes == (0, 2) and b.nodes == (1, 3)
    assert jobs.run(two_rings(folder)) == result  # deterministic: the same rounds, the same floats


def test_two_rings_started_together_replay_with_their_collectives_side_by_side(folder):
    """The jobs above under the timeline model (simfog.fabric.cosim), both starting at 0: identical, so their one
    allreduce per iteration always runs beside the other's, at half the uplink each: c = 2k, every iteration
    C + 2k. Over the start phases the collectives (4 ms of an 86 ms iteration) also miss each other entirely:
    the band's low end is no slowdown at all, exactly."""
    result = jobs.run(two_rings(folder), model="timeline")
    assert result.model == "timeline" and result.rounds == 0
    k = 2 * 2e6 / 1e9
    for job in result.jobs:
        C = job.alone_s - job.duty_alone * job.alone_s
        assert job.duty_alone * job.alone_s == pytest.approx(k, rel=1e-12)
        assert job.together_s == pytest.approx(C + 2 * k, rel=1e-9)
        assert job.slowdown_hi == job.slowdown and job.slowdown_lo == 1.0
    assert jobs.run(two_rings(folder), model="timeline") == result  # deterministic
    with pytest.raises(ConfigError, match="model = 'guess': one of timeline, expectation"):
        jobs.run(two_rings(folder), model="guess")


def test_a_job_that_starts_after_the_other_ends_runs_as_alone(folder):
    result = jobs.run(two_rings(folder, second_start="10s"))
    for job in result.jobs:
        assert job.together_s == job.alone_s and job.slowdown == 1.0
    assert result.jobs[1].start_s == 10.0


def test_half_overlapping_runs_see_half_the_other_jobs_duty(folder):
    """b starts when a has run half its iterations (a alone: 3·t); overlap is then half of a's run (if b's run is
    at least as long), so a sees b at half its duty: a slowdown between none and the full overlap's."""
    full = jobs.run(two_rings(folder)).jobs[0]
    t = full.alone_s
    half = jobs.run(two_rings(folder, second_start=f"{1.5 * t * 1e3}ms")).jobs[0]
    assert 1.0 < half.slowdown < full.slowdown


def test_jobs_on_a_flat_fabric_share_no_link(folder):
    head = HEAD.replace('kind = "fat_tree"\nnodes_per_leaf = 2\nleaf_oversubscription = 2\n', 'kind = "flat"\n')
    result = jobs.run(two_rings(folder, head=head))
    assert result.rounds == 0 and all(j.together_s == j.alone_s for j in result.jobs)


def test_a_ddp_and_an_fsdp_job_share_the_fabric(folder):
    text = HEAD + JOB.format(name="ddp", placement="[0, 2]") + JOB.format(name="fsdp", placement="[1, 3]").replace(
        'merge = "single"\n', 'algorithm = "fsdp"\n')
    result = jobs.run(jobs.load(write(folder, text)))
    assert result.converged and [j.name for j in result.jobs] == ["ddp", "fsdp"]
    assert all(j.slowdown > 1.0 and j.duty_together > j.duty_alone for j in result.jobs)


@pytest.mark.parametrize("extra,field,value", [
    (JOB.format(name="b", placement="[2, 3]"), "job[1].placement", 2),        # node 2 is job a's
    (JOB.format(name="a", placement='"contiguous"'), "job[1].name", "a"),
    (JOB.format(name="b", placement='"nowhere"'), "job[1].placement", "nowhere"),
    (JOB.format(name="b", placement='"contiguous"').replace("ranks = 2", "ranks = 4"), "job[1].ranks", 4),
    (JOB.format(name="b", placement='"contiguous"').replace('merge = "single"', 'merge = "nope"'), "job[1].merge",
     "nope"),
    (JOB.format(name="b", placement='"contiguous"').replace('"t.json"', '"missing.json"'), "job[1].workload",
     "missing.json"),
    (JOB.format(name="b", placement='"contiguous"') + 'start = "-1s"\n', "job[1].start", "-1s"),
])
def test_bad_jobs_files_name_file_field_and_value(folder, extra, field, value):
    text = HEAD.replace("nodes = 4", "nodes = 5") + JOB.format(name="a", placement="[0, 2]") + extra
    with pytest.raises(ConfigError) as err:
        jobs.load(write(folder, text))
    assert (err.value.field, err.value.value) == (field, value) and err.value.source.endswith("jobs.toml")


def test_a_jobs_file_needs_jobs_and_room_for_them(folder):
    with pytest.raises(ConfigError, match="job"):
        jobs.load(write(folder, HEAD))
    text = HEAD + "".join(JOB.format(name=n, placement='"contiguous"') for n in "abc")
    with pytest.raises(ConfigError) as err:
        jobs.load(write(folder, text))
    assert err.value.field == "job[2].ranks"


def test_simulate_prints_each_jobs_times_and_slowdown(folder):
    path = folder / "jobs.toml"
    path.write_text(HEAD + JOB.format(name="a", placement="[0, 2]") + JOB.format(name="b", placement="[1, 3]"))
    out = subprocess.run([sys.executable, "-m", "simfog.cli", "simulate", str(path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "slowdown" in out.stdout and "over phases" in out.stdout  # the timeline model's band
    assert [line.split()[0] for line in out.stdout.splitlines()[1:3]] == ["a", "b"]
    out = subprocess.run([sys.executable, "-m", "simfog.cli", "simulate", str(path), "--json"], capture_output=True,
                         text=True, timeout=120)
    s = json.loads(out.stdout)
    assert s["converged"] and [j["name"] for j in s["jobs"]] == ["a", "b"] and s["jobs"][0]["slowdown"] > 1.0
    assert s["model"] == "timeline" and s["jobs"][0]["slowdown_lo"] <= s["jobs"][0]["slowdown"]
    out = subprocess.run([sys.executable, "-m", "simfog.cli", "simulate", str(path), "--ranks", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--ranks" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["two-ddp", "ddp-fsdp"])
def test_the_shipped_jobs_examples_run_and_converge(name):
    result = jobs.run(jobs.load(REPO / "examples" / "jobs" / f"{name}.toml"))
    assert result.converged and len(result.jobs) == 2
    assert all(j.together_s >= j.alone_s and 0 < j.duty_alone <= j.duty_together <= 1 for j in result.jobs)
    assert max(j.slowdown for j in result.jobs) > 1.01  # 4:1 leaves: sharing them costs something
    assert not set(result.jobs[0].nodes) & set(result.jobs[1].nodes)


@pytest.mark.parametrize("algorithm", ['merge = "single"', 'algorithm = "fsdp"'])
def test_one_job_replayed_alone_is_its_run_alone_bit_for_bit(folder, algorithm):
    """The timeline model's replay of one job (simfog.jobs.replayed) gives back its run: the same records and the
    same summary, float for float (an allreduce and an FSDP job, whose all-gathers gate its compute)."""
    text = HEAD + JOB.format(name="a", placement="[0, 2]").replace('merge = "single"', algorithm)
    [job] = jobs.load(write(folder, text))
    alone = simulate(job.experiment)
    [again] = jobs.replayed([job], [alone], jobs.timelines([job], [alone]), [0.0])
    assert again.interval_records() == list(alone.interval_records())
    assert again.summary() == alone.summary()


@pytest.mark.parametrize("algorithm", ['merge = "wfbp"', 'algorithm = "fsdp"'])
def test_replayed_beside_a_job_that_never_stops_communicating_is_the_run_beside_it(folder, algorithm):
    """Job a replayed beside a job whose collective never ends runs every collective at its speed beside that job
    all the way: the replay's timeline must then be the engine's run of a with the other's traffic always on
    (bucketed backward overlap, FSDP's all-gathers gating compute), to rounding."""
    text = HEAD + "".join(JOB.format(name=n, placement=p).replace('merge = "single"', algorithm)
                          for n, p in (("a", "[0, 2]"), ("b", "[1, 3]")))
    a, b = jobs.load(write(folder, text))
    alone = [simulate(a.experiment), simulate(b.experiment)]
    line = jobs.timelines([a, b], alone)[0]
    forever = cosim.Timeline(((0, 0, "comm", "x", 0.0, 1e6),), {})
    [records, _] = cosim.cosimulate([line, forever], [0.0, 0.0])
    beside = simulate(jobs.with_traffic(a.experiment, [b.traffic(1.0)])).summary()
    replay = Result(a.experiment, records, symmetric=alone[0].symmetric, single_rank_time_s=0.0).summary()
    assert beside["iteration_time_s"] > 1.01 * alone[0].summary()["iteration_time_s"]  # the uplink is shared
    for key in ("iteration_time_s", "comm_s", "comm_exposed_s"):
        assert replay[key] == pytest.approx(beside[key], rel=1e-9)
