"""The round-robin time slice is set for the run and restored afterwards, also after a killed run; without the
sysctl the run goes on with the default slice."""

import pytest

from validate.cluster.scheduling import raise_priority, rr_time_slice


@pytest.fixture
def sysctl(tmp_path):
    path = tmp_path / "sched_rr_timeslice_ms"
    path.write_text("100\n")
    return path


def test_sets_and_restores(sysctl, tmp_path):
    state = tmp_path / "state"
    with rr_time_slice(1, sysctl=sysctl, state=state) as applied:
        assert applied
        assert sysctl.read_text() == "1"
        assert state.read_text() == "100"  # what a later run restores if this one is killed
    assert sysctl.read_text() == "100"
    assert not state.exists()


def test_restores_on_error(sysctl, tmp_path):
    with pytest.raises(RuntimeError), rr_time_slice(1, sysctl=sysctl, state=tmp_path / "state"):
        raise RuntimeError("a rank crashed")
    assert sysctl.read_text() == "100"


def test_leftover_of_a_killed_run_is_restored_first(sysctl, tmp_path):
    state = tmp_path / "state"
    sysctl.write_text("1")  # a validator was killed with the slice shortened ...
    state.write_text("100")  # ... and left the value it had found
    with rr_time_slice(2, sysctl=sysctl, state=state):
        assert sysctl.read_text() == "2"
        assert state.read_text() == "100"  # not the leftover 1 ms
    assert sysctl.read_text() == "100"


def test_without_the_sysctl_nothing_is_set(tmp_path):
    with rr_time_slice(1, sysctl=tmp_path / "missing", state=tmp_path / "state") as applied:
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
    with rr_time_slice(1, sysctl=ReadOnlySysctl(), state=tmp_path / "state") as applied:
        assert not applied
    assert not (tmp_path / "state").exists()
