"""The emulated cluster: namespaces appear and always disappear, and tbf shapes inter-node traffic only.

Needs root, `ip` and tc (tbf); those tests skip with the reason `available()` gives. Rates compared here are the
shaping's correctness (goodput against the configured tbf rate), not the speed of simfog's code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from simfog.errors import ConfigError
from validate.cluster import host_settings, netemu
from validate.cluster.netemu import (
    ALLOWED_CONGESTION_CONTROL,
    EmulatedCluster,
    LoopbackCluster,
    cleanup_leftovers,
    open_cluster,
)

from .conftest import kill_with_supervisor, wait_until

OK, WHY = netemu.available()
needs_root = [pytest.mark.root, pytest.mark.skipif(not OK, reason=WHY or "emulation available")]
PREFIX = "sft"  # a prefix of its own, so nothing here mistakes another run's namespaces for ours
PORT = 5001

# One TCP transfer: "recv ADDR N" listens, prints "ready", times the bytes from first to last and prints the
# goodput (B/s); "send ADDR N" connects and sends N bytes.
XFER = textwrap.dedent(f"""
    import socket, sys, time
    mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "recv":
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, {PORT})); s.listen(1)
        print("ready", flush=True)
        c, _ = s.accept(); got, t0, buf = 0, None, bytearray(1 << 20)
        while got < n:
            k = c.recv_into(buf)
            if not k: break
            t0 = t0 or time.perf_counter(); got += k
        print(got / (time.perf_counter() - t0), got)
    else:
        for _ in range(200):
            try: c = socket.create_connection((addr, {PORT})); break
            except OSError: time.sleep(0.01)
        c.sendall(b"x" * n); c.close()
""")


def ours(prefix: str = PREFIX, pid: int | None = None) -> list[str]:
    """Namespaces of this module's naming with `prefix` (and owner `pid`, when given)."""
    start = f"{prefix}{pid}-" if pid is not None else prefix
    return [ns for ns in netemu._namespaces() if ns.startswith(start) and netemu._OWNED.match(ns)]


def transfer(cluster, src: int, dst: int, nbytes: int) -> float:
    """Goodput (B/s) of one TCP transfer of `nbytes` from node `src` to node `dst`'s address."""
    addr = cluster.nodes[dst].address
    recv = cluster.run_in(dst, [sys.executable, "-c", XFER, "recv", addr, str(nbytes)], stdout=subprocess.PIPE,
                          text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        send = cluster.run_in(src, [sys.executable, "-c", XFER, "send", addr, str(nbytes)])
        out, _ = recv.communicate(timeout=30)
        assert send.wait(timeout=30) == 0
    finally:
        recv.kill()
    goodput, got = out.split()
    assert int(got) == nbytes
    return float(goodput)


def root(fn):
    """Marks a test as needing root, ip and tc, and skips it with the reason when they are missing."""
    for mark in needs_root:
        fn = mark(fn)
    return fn


@root
def test_two_nodes_build_namespaces_links_and_tbf_and_leave_nothing():
    pid = os.getpid()
    allowed_before = ALLOWED_CONGESTION_CONTROL.read_text()
    with EmulatedCluster(2, 1e6, prefix=PREFIX) as c:
        assert sorted(ours(pid=pid)) == sorted([c.switch, c.nodes[0].namespace, c.nodes[1].namespace])
        assert [n.address for n in c.nodes] == ["10.213.0.1", "10.213.0.2"]
        for n in c.nodes:
            link = subprocess.run(["ip", "-n", n.namespace, "-o", "addr", "show", "dev", n.ifname],
                                  capture_output=True, text=True, check=True).stdout
            assert f"{n.address}/24" in link
        ports = subprocess.run(["ip", "-n", c.switch, "-o", "link", "show", "master", "sft-br"],
                               capture_output=True, text=True, check=True).stdout
        assert "sft-p0" in ports and "sft-p1" in ports
        qdisc = subprocess.run(["tc", "-n", c.nodes[0].namespace, "qdisc", "show", "dev", "sft-nic"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in qdisc and "rate 8Mbit" in qdisc  # 1e6 B/s = 8 Mbit/s
        for n in c.nodes:  # not the host's default (BBR here), see netemu.TCP_CONGESTION_CONTROL
            cc = subprocess.run(["ip", "netns", "exec", n.namespace, "sysctl", "-n",
                                 "net.ipv4.tcp_congestion_control"], capture_output=True, text=True, check=True)
            assert cc.stdout.strip() == "cubic"
        assert ALLOWED_CONGESTION_CONTROL.read_text() == allowed_before  # widened only for the moment of setting
        # nothing of ours in the host namespace
        host = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert "sft-" not in host
    assert ours(pid=pid) == []


@root
def test_exception_in_block_tears_down_and_kills_processes_inside():
    pid = os.getpid()
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(2, 1e6, prefix=PREFIX) as c:
            sleeper = c.run_in(1, ["sleep", "60"])
            raise RuntimeError("boom")
    assert sleeper.wait(timeout=5) == -signal.SIGKILL
    assert ours(pid=pid) == []


# Builds a cluster without a with-block, starts a sleeper in node 0, says what it made, then sleeps or exits.
CHILD = textwrap.dedent("""
    import sys, time
    from validate.cluster.netemu import EmulatedCluster
    c = EmulatedCluster(2, 1e6, prefix="sft").__enter__()
    p = c.run_in(0, ["sleep", "60"])
    print(p.pid, c.switch, *(n.namespace for n in c.nodes), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
""")


def _child_cluster(then: str = "sleep"):
    child = subprocess.Popen([sys.executable, "-c", CHILD, then], stdout=subprocess.PIPE, text=True)
    pid, *names = child.stdout.readline().split()
    return child, int(pid), names


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # a zombie waiting for init to reap it is gone too
    except FileNotFoundError:
        return True


@root
def test_sigkilled_owner_s_supervisor_removes_its_namespaces_at_once():
    child, sleeper, names = _child_cluster()
    assert len(names) == 3 and all(n in ours() for n in names)
    child.kill()  # SIGKILL cannot be caught; the supervisor sees its pipe close
    child.wait()
    assert wait_until(lambda: not set(names) & set(ours()) and _gone(sleeper))


@root
def test_owner_sigkilled_with_its_supervisor_leaves_leftovers_that_cleanup_removes():
    child, sleeper, names = _child_cluster()
    assert len(names) == 3 and all(n in ours() for n in names)
    # a live owner's namespaces are not leftovers
    assert not set(names) & set(cleanup_leftovers(PREFIX))
    kill_with_supervisor(child)
    assert all(n in ours() for n in names)  # nothing cleaned up: they are still there
    assert set(names) <= set(cleanup_leftovers(PREFIX))
    assert not set(names) & set(ours())
    deadline = time.monotonic() + 5
    while not _gone(sleeper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(sleeper)


@root
def test_sigterm_on_owner_tears_down_at_once():
    child, sleeper, names = _child_cluster()
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=10) == 128 + signal.SIGTERM  # SystemExit(143): the process still ends as asked
    assert not set(names) & set(ours())
    assert _gone(sleeper)


@root
def test_interpreter_exit_without_leaving_the_block_tears_down():
    child, sleeper, names = _child_cluster("exit")
    assert child.wait(timeout=10) == 0
    assert not set(names) & set(ours())  # atexit did it; no cleanup_leftovers involved
    assert _gone(sleeper)


@root
@pytest.mark.parametrize("rate_Bps, nbytes", [(50e6 / 8, 4_000_000), (200e6 / 8, 16_000_000)])
def test_inter_node_goodput_follows_the_tbf_rate_and_both_directions_are_shaped(rate_Bps, nbytes):
    with EmulatedCluster(2, rate_Bps, prefix=PREFIX) as c:
        goodput = transfer(c, 1, 0, nbytes)
        stats = c.shaper_stats()
    # expected ~0.993 × rate (8948 B of payload per 9014 B frame); ±15 % of the rate is the contract
    assert 0.85 * rate_Bps <= goodput <= 1.15 * rate_Bps, (goodput, rate_Bps)
    # the data passed node 1's upload shaper and node 0's download shaper
    assert stats[1]["upload"]["sent_bytes"] >= nbytes
    assert stats[0]["download"]["sent_bytes"] >= nbytes


@root
def test_traffic_inside_one_node_goes_over_loopback_unshaped():
    rate_Bps, nbytes = 50e6 / 8, 4_000_000
    with EmulatedCluster(2, rate_Bps, prefix=PREFIX) as c:
        goodput = transfer(c, 0, 0, nbytes)  # both ends in node 0, to node 0's NIC address
        stats = c.shaper_stats()
    assert goodput > 3 * rate_Bps, goodput
    assert stats[0]["upload"]["sent_bytes"] < nbytes / 10  # the bytes never reached the shaped veth


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="prefix"):
        EmulatedCluster(2, 1e6, prefix="Bad-Prefix")
    with pytest.raises(ConfigError, match="nodes"):
        EmulatedCluster(0, 1e6)
    with pytest.raises(ConfigError, match="nic_bandwidth"):
        EmulatedCluster(2, 0)
    with pytest.raises(ConfigError, match="burst"):
        EmulatedCluster(2, 1e6, burst_bytes=100)


def test_tbf_sizes_follow_the_rate_with_floors():
    # 10 Gbit/s: burst = 1 ms = 1.25 MB, limit = 20 ms = 25 MB; 8 Mbit/s: the floors (16 KiB, 256 KiB)
    fast, slow = EmulatedCluster(2, 1.25e9), EmulatedCluster(2, 1e6)
    assert (fast.burst_bytes, fast.limit_bytes) == (1_250_000, 25_000_000)
    assert (slow.burst_bytes, slow.limit_bytes) == (16384, 262144)


def test_without_root_available_says_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ok, why = netemu.available.__wrapped__()
    assert not ok and "root" in why


def test_forced_fallback_is_loopback_and_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(netemu, "_fallback_said", False)
    monkeypatch.setattr(netemu, "available", lambda: (False, "no root in this test"))
    with open_cluster(3, 1e6, prefix=PREFIX) as c:
        assert isinstance(c, LoopbackCluster) and not c.shaped
        assert [(n.address, n.ifname) for n in c.nodes] == [("127.0.0.1", "lo")] * 3
        assert c.run_in(2, [sys.executable, "-c", "raise SystemExit(7)"]).wait(timeout=30) == 7
    open_cluster(2, 1e6)
    assert capsys.readouterr().err.count("no root in this test") == 1
    with pytest.raises(netemu.NetemuError, match="no root in this test"):
        open_cluster(2, 1e6, emulate=True)


# ---- the host's allowed congestion-control list: widened for a moment, restored, also after a SIGKILL ----
# (shared by clusters built at once: test_host_settings.py)

@pytest.fixture
def allowed(tmp_path):
    path = tmp_path / "tcp_allowed_congestion_control"
    path.write_text("reno bbr\n")
    return path


def cc_record(state):
    return host_settings.read_record(netemu.CC_SETTING, state)


def test_allowed_list_is_widened_for_the_block_and_restored(allowed, tmp_path):
    state = tmp_path / "state"
    with netemu.allowed_congestion_control("cubic", sysctl=allowed, state_dir=state):
        assert allowed.read_text().split() == ["reno", "bbr", "cubic"]
        record = cc_record(state)  # what is restored if this run is killed
        assert record["original"] == "reno bbr" and record["holders"][0].startswith(f"{os.getpid()}-")
    assert allowed.read_text().split() == ["reno", "bbr"]
    assert cc_record(state) is None
    with netemu.allowed_congestion_control("reno", sysctl=allowed, state_dir=state):  # allowed already: untouched
        assert allowed.read_text().split() == ["reno", "bbr"] and cc_record(state) is None


# Widens the list at argv[1] (state folder argv[2]), says so, and waits to be killed.
WIDENER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from validate.cluster.netemu import allowed_congestion_control
    with allowed_congestion_control("cubic", sysctl=Path(sys.argv[1]), state_dir=Path(sys.argv[2])):
        print("widened", flush=True)
        time.sleep(60)
""")


def _widener(allowed, state) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WIDENER, str(allowed), str(state)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "widened"
    return proc


def test_list_left_widened_by_a_killed_run_is_restored_by_its_supervisor(allowed, tmp_path):
    state = tmp_path / "state"
    proc = _widener(allowed, state)
    try:
        # while its owner lives, the widening is not a leftover
        assert not netemu.restore_allowed_congestion_control(sysctl=allowed, state_dir=state)
        assert allowed.read_text().split() == ["reno", "bbr", "cubic"]
    finally:
        proc.kill()  # SIGKILL: it cannot restore the list; its supervisor does, at once
        proc.wait()
    assert wait_until(lambda: allowed.read_text().split() == ["reno", "bbr"])
    assert cc_record(state) is None


def test_list_left_widened_by_a_run_killed_with_its_supervisor_is_restored_by_the_next(allowed, tmp_path):
    state = tmp_path / "state"
    kill_with_supervisor(_widener(allowed, state))
    assert allowed.read_text().split() == ["reno", "bbr", "cubic"]  # left widened ...
    with netemu.allowed_congestion_control("cubic", sysctl=allowed, state_dir=state):
        assert cc_record(state)["original"] == "reno bbr"  # ... and the next run starts from the real list
    assert allowed.read_text().split() == ["reno", "bbr"]
    assert cc_record(state) is None


@root
def test_next_cluster_restores_a_list_left_widened(allowed, tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    allowed.write_text("reno bbr cubic\n")
    # a validator killed (with its supervisor) while the list was widened
    (state / f"{netemu.CC_SETTING}.json").write_text(json.dumps({"original": "reno bbr",
                                                                  "holders": [f"{dead.pid}-1-0"]}))
    monkeypatch.setattr(netemu, "ALLOWED_CONGESTION_CONTROL", allowed)
    monkeypatch.setattr(host_settings, "STATE_DIR", state)
    # reno is allowed everywhere, so building this cluster widens nothing of the host's real list
    with EmulatedCluster(1, 25e6, prefix=PREFIX, verify=False, tcp_congestion_control="reno"):
        assert allowed.read_text().split() == ["reno", "bbr"]
        assert cc_record(state) is None
    assert ours(pid=os.getpid()) == []
