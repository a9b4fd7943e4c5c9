"""An emulated cluster on one Linux machine: one network namespace per node, shaped links into a bridge.
Over 400 lines because building, checking and always tearing down the namespaces, veth pairs and tbf shapers, with
why each tbf setting is what it is, belong together.

Layout for a run with owner pid P, sequence number S and prefix "sf" (names are unique per process and run):

    namespace sfP-S-sw   bridge "sf-br" with one port "sf-p<i>" per node   (the switch; nothing in the host's
                                                                            namespace is touched)
    namespace sfP-S-n<i> "lo" up and "sf-nic" = 10.213.0.<i+1>/24          (node i; its ranks share it)

Each node's veth pair is created in one netlink request with its ends already in the node and switch namespaces, so
no interface ever appears in the host namespace. Shaping uses `tc ... tbf` (this kernel has tbf and htb, no netem,
so latency cannot be added): the node-side "sf-nic" egress shapes the node's upload, the switch-side "sf-p<i>"
egress shapes its download. Ranks of one node reach each other through the node's own address, which the kernel
routes over the namespace's loopback, so intra-node traffic is never shaped (tests/validate/test_netemu.py
measures both). The links carry jumbo frames (MTU 9000, see MTU). TCP goodput is ~99.3 % of the tbf rate: tbf
counts the 14 B Ethernet header, and IP + TCP with timestamps add 52 B, so a 9014 B frame carries 8948 B of payload.

Teardown (kill every process left in the namespaces, delete them) runs on leaving the with-block, on SIGTERM and
SIGINT (handlers are installed for the block's duration and the old ones restored), and at interpreter exit. A
SIGKILLed owner cannot clean up: its supervisor does (validate.cluster.supervisor: the namespaces are journaled
before the first is made), and should that be killed too, the next cluster (or `cleanup_leftovers`) removes
namespaces whose owner pid is dead, and restores the host's allowed congestion-control list if it was left widened
(see below).
Without root, `ip` or tc tbf, `available()` says why and `open_cluster` falls back to `LoopbackCluster`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from simfog.errors import ConfigError, SimfogError
from validate.cluster import host_settings, supervisor

SUBNET = "10.213.0"  # a private /24 that only ever exists inside this module's own namespaces
NODE_IFNAME = "{prefix}-nic"  # node side of the veth, inside the node namespace
PORT_IFNAME = "{prefix}-p{index}"  # switch side, inside the switch namespace
BRIDGE_IFNAME = "{prefix}-br"
MOST_NODES = 250  # addresses of SUBNET
NETNS_DIR = "/run/netns"  # where `ip netns add` bind-mounts a namespace under its name
# Jumbo frames, as the Ethernet fabrics of training clusters are set up (9000 B; RoCE and EFA also run frames of
# 4-9 kB). Every frame costs the emulation CPU at each hop (veth, tbf, bridge, htb), and on this 2-core host that
# cost made the network's speed follow the CPU's: at MTU 1500, two 2-rank MLP jobs at 200 Mbit/s kept the cores
# 71-87 % busy where the compute is only waited, and a launch came out 5-12 % slow at random (single runs of one
# configuration: 48.9-55.9 ms; the together rows host-limited); at 9000 the same rows keep them 19-31 % busy and
# eight launches of one configuration gave 46.9-49.1 ms.
MTU = 9000
# Payload bytes per byte tbf counts: a frame of MTU + 14 B (the Ethernet header, counted by tbf) carries MTU - 52 B
# of TCP payload (IP 20 + TCP 20 + timestamps 12). What all the TCP flows through one shaped NIC carry at most: the
# NIC capacity of simfog's flow-level point-to-point model (validate.run).
TCP_GOODPUT = (MTU - 52) / (MTU + 14)

# tbf defaults, why these numbers (Linux sch_tbf.c; tc-tbf(8)):
# - burst: the bucket must hold the largest packet it passes (else tbf segments GSO packets first), and the
#   qdisc watchdog is an hrtimer that fires with tens of µs of jitter, so the bucket must cover a few such gaps at
#   high rates. Every byte of bucket is also sent at veth speed after an idle period, i.e. an error of burst/rate
#   seconds per idle gap. rate × 1 ms, at least 16 KiB (~11 frames of 1500 B, ~2 of 9000), keeps that error at
#   1 ms per idle gap (more below 131 Mbit/s, where the floor rules). Measured here at MTU 1500, 2 cores, one TCP
#   flow: 0.96 of the rate from 50 Mbit/s to 10 Gbit/s with these sizes; a 1600 B bucket gave 0.45 at 1 Gbit/s
#   and 0.07 at 5 Gbit/s.
BURST_S = 1e-3
MIN_BURST_BYTES = 16 * 1024
# - limit: bytes that may queue behind the bucket. Too small and TCP's bursts overflow it (drops, retransmits,
#   goodput well below rate); too large and a bulk flow adds queueing delay to everything behind it. 20 ms of line
#   rate (at least 256 KiB) absorbs a TSO burst of several 64 KiB segments from each of a few flows; TCP small
#   queues keeps one flow from filling it at low rates. Measured: a 30 kB queue at 200 Mbit/s dropped 7465
#   packets in 17.5 MB and gave 0.72 of the rate; 500 kB (the default there) dropped none and gave 0.96.
QUEUE_S = 20e-3
MIN_LIMIT_BYTES = 256 * 1024
# TCP congestion control in the node namespaces: CUBIC, the kernel default on cluster nodes. Namespaces inherit the
# host's default, which on this machine is BBR: pacing-based, it left every link of an 8-rank ring idle for ~10 ms
# at a time (perf sched: all gloo loop threads asleep, no drops), and 1 in ~10 iterations took 1.5-4x the median
# (MLP, 8 nodes at 1 Gbit/s: iteration-time CV 0.2-0.47; 0.02-0.05 without BBR). Reno, which any namespace may
# select, overshoots tbf's queue instead: a 1 MB sendrecv at 1 Gbit/s took 8 or 14 ms at random (CUBIC, with
# HyStart leaving slow start early: 8.0-9.9 ms). A namespace may only pick a congestion control that the host's
# net.ipv4.tcp_allowed_congestion_control lists; when CUBIC is missing there, it is added for the moment of
# setting and the list restored at once (the namespace keeps its setting). The list is held meanwhile
# (validate.cluster.host_settings, setting CC_SETTING): clusters built at once share the widening, the last one
# restores the list it found, and a SIGKILL is undone by the killed process's supervisor.
TCP_CONGESTION_CONTROL = "cubic"
ALLOWED_CONGESTION_CONTROL = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
CC_SETTING = "allowed-congestion-control"

_OWNED = re.compile(r"^(?P<prefix>[a-z]+)(?P<pid>\d+)-(?P<seq>\d+)-(?P<role>sw|probe|n\d+)$")
_PREFIX = re.compile(r"^[a-z]{1,6}$")  # no digits: the owner pid follows it in namespace names
_seq = itertools.count()
_fallback_said = False


class NetemuError(SimfogError):
    """An `ip`/`tc` command failed while building or removing an emulated cluster."""


@dataclass(frozen=True)
class NodeSpec:
    """One node: its index, namespace ("" on loopback), address of its NIC and the NIC's name in the namespace."""

    index: int
    namespace: str
    address: str
    ifname: str


def _sh(*argv: str, check: bool = True, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
    """Runs one `ip`/`tc` command; raises NetemuError naming it and its stderr when it fails and `check`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetemuError(f"`{' '.join(argv)}` failed: {e}") from None
    if check and done.returncode != 0:
        raise NetemuError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done


def _check_prefix(prefix: str) -> None:
    if not _PREFIX.match(prefix):
        raise ConfigError("prefix", prefix, "1-6 lower-case letters (interface names must stay within 15 "
                          "characters, and the owner pid follows the prefix in namespace names)")


def _namespaces() -> list[str]:
    done = _sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _kill_namespace_processes(namespace: str, wait_s: float = 5.0) -> list[int]:
    """SIGKILLs every process whose network namespace is `namespace`, waits until they are gone; returns the pids."""
    me = os.getpid()
    done = _sh("ip", "netns", "pids", namespace, check=False)
    pids = [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != me]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        # a zombie has left its namespaces already (exit_task_namespaces), so `ip netns pids` no longer lists it
        if not _sh("ip", "netns", "pids", namespace, check=False).stdout.split():
            break
        time.sleep(0.02)
    return pids


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    _sh("ip", "netns", "del", namespace, check=False)


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when network namespaces with veth pairs and tc tbf can be built here, else (False, why).

    Probes by building and deleting a throwaway namespace; the answer is cached for the process."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, f"network namespaces need root (euid is {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not on PATH"
    run = f"sf{os.getpid()}-{next(_seq)}"
    ns = f"{run}-probe"
    key = supervisor.register(remove_run, run=run)
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b")
        _sh("ip", "-n", ns, "link", "add", "name", "br", "type", "bridge")
        _sh("ip", "-n", ns, "link", "set", "dev", "a", "up")
        _sh("tc", "-n", ns, "qdisc", "add", "dev", "a", "root", "tbf", "rate", "1mbit", "burst", "16kb", "limit",
            "64kb")
    except NetemuError as e:
        return False, f"cannot build an emulated network here: {e}"
    finally:
        _sh("ip", "netns", "del", ns, check=False)
        supervisor.forget(key)
    return True, ""


def cleanup_leftovers(prefix: str = "sf", *, include_live: bool = False) -> list[str]:
    """Removes namespaces named by this module with `prefix` whose owning process is dead (all of them when
    `include_live`), first killing processes still inside. Returns the removed names.

    Only names of the exact form prefix<pid>-<seq>-{sw,n<i>,probe} are touched, so a host's own namespaces and
    clusters of live processes (other runs, other helpers) are left alone. Interfaces never live in the host
    namespace (see the module docstring), so deleting the namespaces removes every veth and bridge with them."""
    _check_prefix(prefix)
    removed = []
    for ns in _namespaces():
        m = _OWNED.match(ns)
        if not m or m["prefix"] != prefix:
            continue
        if not include_live and supervisor.process_alive(int(m["pid"])):
            continue
        _delete_namespace(ns)
        removed.append(ns)
    return removed


def remove_run(run: str) -> list[str]:
    """Removes the namespaces of one cluster (or probe) `run` ("<prefix><pid>-<seq>"), first killing processes
    still inside; what its supervisor does when the owner was killed. Returns the removed names."""
    removed = []
    for ns in _namespaces():
        if ns.startswith(f"{run}-") and _OWNED.match(ns):
            _delete_namespace(ns)
            removed.append(ns)
    return removed


def restore_allowed_congestion_control(*, sysctl: Path | None = None, state_dir: Path | None = None) -> bool:
    """Puts back the allowed congestion-control list (sysctl default ALLOWED_CONGESTION_CONTROL) when every process
    that widened it died unreleased, supervisors included; a live widener's hold stays. Returns whether it
    restored a list."""
    return host_settings.restore_abandoned(CC_SETTING, sysctl or ALLOWED_CONGESTION_CONTROL, state_dir=state_dir)


@contextlib.contextmanager
def allowed_congestion_control(name: str, *, sysctl: Path | None = None,
                               state_dir: Path | None = None) -> Iterator[None]:
    """Holds `name` in the host's allowed congestion-control list for the duration (added when missing; see
    host_settings.holding), so that a namespace may select it."""
    def widened(original: str) -> str:
        allowed = original.split()
        return original if name in allowed else " ".join([*allowed, name])

    with host_settings.holding(CC_SETTING, sysctl or ALLOWED_CONGESTION_CONTROL, widened, state_dir=state_dir):
        yield


def _set_congestion_control(ns: str, name: str) -> None:
    """Make `name` the TCP congestion control of namespace `ns` (see TCP_CONGESTION_CONTROL). Raises NetemuError
    when the kernel does not have it."""
    setting = ("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={name}")
    try:
        _sh(*setting)
        return
    except NetemuError:
        try:
            allowed = ALLOWED_CONGESTION_CONTROL.read_text().split()
        except OSError as e:
            raise NetemuError(f"cannot read {ALLOWED_CONGESTION_CONTROL}: {e}") from None
        if name in allowed:
            raise
    try:
        with allowed_congestion_control(name):
            _sh(*setting)
    except OSError as e:
        raise NetemuError(f"cannot allow TCP congestion control {name} in {ALLOWED_CONGESTION_CONTROL}: {e}") from None


def _delegate(old, signum, frame) -> None:
    """Does what the handler we replaced would have done."""
    if callable(old):
        old(signum, frame)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        raise SystemExit(128 + signum)


class EmulatedCluster:
    """`nodes` namespaces joined by tbf-shaped veth pairs through a bridge; a context manager.

    `nic_bandwidth_Bps` (bytes/s) is each node's rate in each direction. `burst_bytes` and `limit_bytes` override
    the tbf bucket and queue sizes (defaults: rate × BURST_S and rate × QUEUE_S, with floors; see the constants);
    `tcp_congestion_control` the nodes' TCP congestion control (default TCP_CONGESTION_CONTROL).
    Entering builds and verifies the network (raises NetemuError on failure, leaving nothing behind); leaving, a
    SIGTERM/SIGINT or interpreter exit tears it down."""

    shaped = True

    def __init__(self, nodes: int, nic_bandwidth_Bps: float, *, prefix: str = "sf", burst_bytes: int | None = None,
                 limit_bytes: int | None = None, verify: bool = True,
                 tcp_congestion_control: str = TCP_CONGESTION_CONTROL):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MOST_NODES:
            raise ConfigError("cluster.nodes", nodes, f"an integer from 1 to {MOST_NODES} for an emulated cluster")
        if not nic_bandwidth_Bps > 0:
            raise ConfigError("cluster.nic_bandwidth", nic_bandwidth_Bps, "a bandwidth > 0")
        _check_prefix(prefix)
        self.nic_bandwidth_Bps = float(nic_bandwidth_Bps)
        self.prefix = prefix
        self.burst_bytes = int(burst_bytes or max(MIN_BURST_BYTES, self.nic_bandwidth_Bps * BURST_S))
        self.limit_bytes = int(limit_bytes or max(MIN_LIMIT_BYTES, self.nic_bandwidth_Bps * QUEUE_S))
        if self.burst_bytes < MTU + 14 or self.limit_bytes < self.burst_bytes:
            raise ConfigError("burst_bytes/limit_bytes", (burst_bytes, limit_bytes),
                              f"burst >= {MTU + 14} (one frame) and limit >= burst")
        self.verify = verify
        self.tcp_congestion_control = tcp_congestion_control
        self.run = f"{prefix}{os.getpid()}-{next(_seq)}"  # unique per process and cluster: no two runs collide
        self.switch = f"{self.run}-sw"
        ifname = NODE_IFNAME.format(prefix=prefix)
        self.nodes = tuple(NodeSpec(i, f"{self.run}-n{i}", f"{SUBNET}.{i + 1}", ifname) for i in range(nodes))
        self._created: list[str] = []
        self._started: list[subprocess.Popen] = []
        self._torn_down = False
        self._old_handlers: dict[int, object] = {}
        self._journal: int | None = None

    @classmethod
    def for_cluster(cls, cluster, **kwargs) -> EmulatedCluster:
        """The emulated cluster for a `simfog.cluster.Cluster` (its nodes and NIC bandwidth)."""
        return cls(cluster.nodes, cluster.nic.bandwidth_Bps, **kwargs)

    # -- building ---------------------------------------------------------------------------------------------
    def __enter__(self) -> EmulatedCluster:
        # journaled before anything is made: a kill from here on leaves nothing for long
        self._journal = supervisor.register(remove_run, run=self.run)
        self._install_handlers()
        atexit.register(self._teardown)
        try:
            cleanup_leftovers(self.prefix)
            with contextlib.suppress(OSError):  # without the sysctl there is nothing to restore
                restore_allowed_congestion_control()
            self._build()
            if self.verify:
                self._verify()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _add_namespace(self, ns: str) -> None:
        _sh("ip", "netns", "add", ns)
        self._created.append(ns)
        _sh("ip", "-n", ns, "link", "set", "dev", "lo", "up")

    def _tbf(self, ns: str, dev: str) -> None:
        rate_bit = f"{int(round(self.nic_bandwidth_Bps * 8))}bit"
        _sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate_bit,
            "burst", str(self.burst_bytes), "limit", str(self.limit_bytes))

    def _build(self) -> None:
        sw, br = self.switch, BRIDGE_IFNAME.format(prefix=self.prefix)
        self._add_namespace(sw)
        _sh("ip", "-n", sw, "link", "add", "name", br, "type", "bridge")  # STP is off by default: ports forward at once
        _sh("ip", "-n", sw, "link", "set", "dev", br, "up")
        for node in self.nodes:
            port = PORT_IFNAME.format(prefix=self.prefix, index=node.index)
            self._add_namespace(node.namespace)
            _set_congestion_control(node.namespace, self.tcp_congestion_control)
            _sh("ip", "-n", node.namespace, "link", "add", "name", node.ifname, "mtu", str(MTU), "type", "veth",
                "peer", "name", port, "mtu", str(MTU), "netns", sw)
            _sh("ip", "-n", sw, "link", "set", "dev", port, "master", br)
            _sh("ip", "-n", sw, "link", "set", "dev", port, "up")
            _sh("ip", "-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", node.ifname)
            _sh("ip", "-n", node.namespace, "link", "set", "dev", node.ifname, "up")
            self._tbf(node.namespace, node.ifname)  # upload
            self._tbf(sw, port)  # download

    def _verify(self) -> None:
        """Every node has its two tbf qdiscs, and node 0 reaches every other node (a TCP connect to a closed port
        is refused at once when the peer is reachable, and times out when it is not)."""
        for node in self.nodes:
            for ns, dev in ((node.namespace, node.ifname),
                            (self.switch, PORT_IFNAME.format(prefix=self.prefix, index=node.index))):
                if " tbf " not in _sh("tc", "-n", ns, "qdisc", "show", "dev", dev).stdout:
                    raise NetemuError(f"no tbf qdisc on {dev} in namespace {ns}")
        if len(self.nodes) < 2:
            return
        probe = ("import socket,sys\n"
                 "for a in sys.argv[1:]:\n"
                 "    s=socket.socket(); s.settimeout(3)\n"
                 "    try: s.connect((a, 9))\n"
                 "    except ConnectionRefusedError: pass\n"
                 "    except OSError as e: sys.exit(f'{a}: {e}')\n")
        done = subprocess.run(["ip", "netns", "exec", self.nodes[0].namespace, sys.executable, "-c", probe,
                               *(n.address for n in self.nodes[1:])], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise NetemuError(f"node 0 cannot reach the other nodes: {done.stderr.strip()}")

    # -- using ------------------------------------------------------------------------------------------------
    def run_in(self, node: int, argv, **popen_kwargs) -> subprocess.Popen:
        """Starts `argv` inside node `node`'s namespace and returns once it is in there (or has exited).

        `ip netns exec` enters the namespace and then execs `argv`, so the pid is the program's. Waiting for the
        switch closes a race: a teardown finds processes by namespace, and one that had not yet entered would
        escape it and keep the deleted namespace alive. Started processes are also killed at teardown by pid."""
        if self._torn_down:
            raise NetemuError("the emulated cluster has been torn down")
        ns = self.nodes[node].namespace
        target = f"net:[{os.stat(f'{NETNS_DIR}/{ns}').st_ino}]"
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **popen_kwargs)
        self._started.append(proc)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if os.readlink(f"/proc/{proc.pid}/ns/net") == target:
                    break
            except OSError:
                pass  # just exited
            time.sleep(0.001)
        return proc

    def shaper_stats(self) -> list[dict]:
        """Per node: bytes sent and packets dropped by its upload and download tbf (from `tc -s -j qdisc show`)."""
        import json

        def one(ns, dev):
            q = json.loads(_sh("tc", "-s", "-j", "-n", ns, "qdisc", "show", "dev", dev).stdout)[0]
            return {"sent_bytes": q.get("bytes", 0), "dropped_packets": q.get("drops", 0)}

        out = []
        for node in self.nodes:
            up = one(node.namespace, node.ifname)
            down = one(self.switch, PORT_IFNAME.format(prefix=self.prefix, index=node.index))
            out.append({"node": node.index, "upload": up, "download": down})
        return out

    # -- tearing down -----------------------------------------------------------------------------------------
    def __exit__(self, *exc) -> None:
        try:
            self._teardown()
        finally:
            atexit.unregister(self._teardown)
            self._restore_handlers()

    def _teardown(self) -> None:
        """Kills what runs in the namespaces and deletes them (which deletes the veths and the bridge). Idempotent;
        SIGINT/SIGTERM are held back meanwhile so that a signal cannot cut it short."""
        if self._torn_down:
            return
        main = threading.current_thread() is threading.main_thread()
        held = {signal.SIGINT, signal.SIGTERM}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, held) if main else None
        try:
            self._torn_down = True
            for proc in self._started:
                if proc.poll() is None:
                    proc.kill()
            for ns in reversed(self._created):  # nodes first, then the switch
                _delete_namespace(ns)
            left = set(self._created) & set(_namespaces())
            if left:
                raise NetemuError(f"could not delete namespaces {sorted(left)}")
            self._created.clear()
            supervisor.forget(self._journal)  # on failure it stays: the supervisor tries again
        finally:
            if old_mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals are delivered to the main thread only; atexit still covers us
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.getsignal(sig)
            if old is signal.SIG_IGN:
                continue

            def handler(signum, frame, old=old):
                self._teardown()
                _delegate(old, signum, frame)

            self._old_handlers[sig] = (old, handler)
            signal.signal(sig, handler)

    def _restore_handlers(self) -> None:
        for sig, (old, mine) in self._old_handlers.items():
            if signal.getsignal(sig) is mine:  # someone else's newer handler stays
                signal.signal(sig, old)
        self._old_handlers.clear()


class LoopbackCluster:
    """The fallback without namespaces: every node is 127.0.0.1 on "lo", nothing is shaped, `run_in` is Popen.
    `reason` says why there is no emulated network."""

    shaped = False

    def __init__(self, nodes: int, nic_bandwidth_Bps: float | None = None, *, reason: str = ""):
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ConfigError("cluster.nodes", nodes, "an integer >= 1")
        self.nic_bandwidth_Bps = nic_bandwidth_Bps
        self.reason = reason
        self.nodes = tuple(NodeSpec(i, "", "127.0.0.1", "lo") for i in range(nodes))

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def run_in(self, node: int, argv, **popen_kwargs) -> subprocess.Popen:
        """Starts `argv` as a plain process (node `node` only has to exist: IndexError otherwise)."""
        self.nodes[node]  # noqa: B018 - the index check
        return subprocess.Popen(list(argv), **popen_kwargs)

    def shaper_stats(self) -> list[dict]:
        return []


def open_cluster(nodes: int, nic_bandwidth_Bps: float, *, emulate: bool | None = None, prefix: str = "sf",
                 **kwargs) -> EmulatedCluster | LoopbackCluster:
    """An EmulatedCluster when `available()` (or `emulate` is True: then NetemuError if it is not), else a
    LoopbackCluster; the fallback reason is printed to stderr once per process. `emulate=False` or the environment
    variable SIMFOG_NETEMU=0 force the loopback. Use the result as a context manager."""
    global _fallback_said
    if emulate is False:
        why = "emulation turned off by the caller"
    elif emulate is None and os.environ.get("SIMFOG_NETEMU", "") == "0":
        why = "SIMFOG_NETEMU=0"
    else:
        ok, why = available()
        if ok:
            return EmulatedCluster(nodes, nic_bandwidth_Bps, prefix=prefix, **kwargs)
        if emulate:
            raise NetemuError(why)
    if not _fallback_said:
        print(f"simfog: no emulated network ({why}); ranks run on plain loopback, unshaped", file=sys.stderr)
        _fallback_said = True
    return LoopbackCluster(nodes, nic_bandwidth_Bps, reason=why)
