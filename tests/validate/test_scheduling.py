"""The round-robin time slice is held for the run and restored afterwards, also after a killed run; without the
sysctl the run goes on with the default slice. (Several holders at once: test_host_settings.py.)"""

import json

import pytest

from validate.cluster.scheduling import SETTING, raise_priority, rr_time_slice


@pytest.fixture
def sysctl(tmp_path):
    path = tmp_path / "sched_rr_timeslice_ms"
    path.write_text("100\n")
    return path


def record(state_dir):
    path = state_dir / f"{SETTING}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_sets_and_restores(sysctl, tmp_path):
    state = tmp_path / "state"
    with rr_time_slice(1, sysctl=sysctl, state_dir=state) as applied:
        assert applied
        assert sysctl.read_text() == "1"
        assert record(state)["original"] == "100"  # what is restored if this run is killed
    assert sysctl.read_text() == "100"
    assert record(state) is None


def test_restores_on_error(sysctl, tmp_path):
    with pytest.raises(RuntimeError), rr_time_slice(1, sysctl=sysctl, state_dir=tmp_path / "state"):
        raise RuntimeError("a rank crashed")
    assert sysctl.read_text() == "100"


def test_leftover_of_a_killed_run_is_restored_first(sysctl, tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    sysctl.write_text("1")  # a validator was killed with the slice shortened, and its supervisor too ...
    (state / f"{SETTING}.json").write_text(json.dumps({"original": "100", "holders": ["999999999-1-0"]}))
    with rr_time_slice(2, sysctl=sysctl, state_dir=state):
        assert sysctl.read_text() == "2"
        assert record(state)["original"] == "100"  # ... not the leftover 1 ms
    assert sysctl.read_text() == "100"


def test_without_the_sysctl_nothing_is_set(tmp_path):
    with rr_time_slice(1, sysctl=tmp_path / "missing", state_dir=tmp_path / "state") as applied:
        assert not applied
    assert not (tmp_path / "state").exists()


def test_priority_none_changes_nothing():
    assert raise_priority("none") is True


class ReadOnlySysctl:
    """Readable, not writable: a sysctl without root."""

    def read_text(self):
        return "100\n"

    def write_text(self, text):
        raise PermissionError("not root")


def test_read_only_sysctl_leaves_no_state(tmp_path):
    with rr_time_slice(1, sysctl=ReadOnlySysctl(), state_dir=tmp_path / "state") as applied:
        assert not applied
    assert record(tmp_path / "state") is None


def test_a_state_folder_others_may_write_is_refused(sysctl, tmp_path):
    """Another user could plant a record (and so the value restored) or a symlink in it: not used at all."""
    state = tmp_path / "state"
    state.mkdir(mode=0o777)
    state.chmod(0o777)
    with rr_time_slice(1, sysctl=sysctl, state_dir=state) as applied:
        assert not applied and sysctl.read_text() == "100\n"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with rr_time_slice(1, sysctl=sysctl, state_dir=link) as applied:
        assert not applied
    assert list((tmp_path / "elsewhere").iterdir()) == []
