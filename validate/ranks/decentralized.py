"""Real runs of decentralized averaging for the validator: BlueFog-style neighbour averaging and WAGMA group averaging.

Both average the model's *parameters* (not gradients), as one flat buffer of the trace's tensors (the replay
model's parameters are made views into it, so nothing is copied to send). The communication is fixed by the
simulator's own objects, so that both sides move the same messages: `worker_fields` turns the `Simulation`'s
algorithm (simfog.algorithms.dataflow.bluefog.NeighborAveraging / simfog.algorithms.dynamic.program.WAGMA) into an
explicit per-iteration schedule that `validate.ranks.worker` follows.

- `NeighborExchange` (algorithm "neighbor", combine "awc", a non-hierarchical topology such as one_peer_exp2): at
  the end of forward (backward start) the rank posts `dist.isend` of its flat parameters to every `send_to` of its
  `simfog.topology` Exchange for the iteration and `dist.irecv` from every `recv_from` (BlueFog's MPI controller
  does MPI_Isend/Irecv + Waitall); before the optimizer step it waits for all of them and combines,
  x <- self_weight*x + sum(recv_weight*x_peer) (1/2, 1/2 for one peer). No negotiation (BlueFog's default
  negotiates every op through rank 0): the simulated side runs with comm.negotiate = false to match.
- `GroupAverage` (algorithm "wagma"): at backward start, the rank allreduces a copy of its flat parameters within its
  group of the iteration (`dist.new_group` for every group that occurs, all created once, on all ranks, in one
  order) or, every global_every-th iteration, on the world group; before the optimizer step it waits and takes the
  average. DIFFERENCE FROM WAGMA AND FROM simfog's MODEL: real WAGMA's group collective is wait-avoiding (the first
  member to arrive triggers it, late members contribute their current, stale, weights through a progress thread,
  one-sided MPI), and simfog models exactly that. gloo has no such operation: here the group allreduce is
  blocking, it starts when the last member of the group has launched it, i.e. the group waits for its members.
  The two coincide when the members arrive together (homogeneous replay); with stragglers they do not, and the
  validator refuses heterogeneity for wagma. gloo's allreduce is also a ring (2(S-1) steps of M/S), where WAGMA and
  simfog use recursive doubling (log2 S rounds of M): equal for S = 2 up to one latency, not for larger groups or
  the global step (ring 2(P-1)/P*M*beta against log2(P)*M*beta).

What a rank records per measured iteration (perf_counter seconds): launch and completion of the exchange
("launch", "done"), the ranks whose launch gates it ("peers": itself and its peers or group), its name as the
simulator names the communication ("neighbor", "group", "global"), and what it actually sent and received
("sends"/"recvs" as [peer, bytes]; "group" for wagma). Per configuration, `values` holds the first and last
element of the flat parameters after every iteration's averaging (warm-up included): both are set to the rank id
just before each exchange (two scalar writes), so they show exactly whose parameters were averaged with which
weights, e.g. (r + (r - 2^(k mod D) mod n)) / 2 for one-peer exp2.

torch is imported inside the functions that need it: `worker_fields` and the checks run without torch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence

from simfog.errors import ConfigError

ALGORITHMS = ("neighbor", "wagma")
WAGMA_NOTE = ("wagma: real = blocking gloo group allreduce (a ring; the group waits for its members), simulated = "
              "the same (wait_for_group, group ring through simfog.p2p, global gloo ring), not the wait-avoiding "
              "recursive doubling of real WAGMA; the two agree when members arrive together (homogeneous replay)")
NEIGHBOR_NOTE = "neighbor: isend/irecv of the flat parameters at backward start, waited before the step; no negotiation"


# --- the schedule, from the simulator's algorithm object (no torch) ---------------------------------------------------

def wagma_groups(alg) -> list[list[list[int]]]:
    """Per layout of a simfog WAGMA instance: its groups (sorted member lists, by group id). A rank's group under
    layout l is the ranks that differ from it only in the bits alg.layouts[l], exactly as WAGMA.backward_started
    names it (gid = rank & ~mask)."""
    out = []
    for bits in alg.layouts:
        mask = sum(1 << b for b in bits)
        groups: dict[int, list[int]] = {}
        for r in range(alg.n):
            groups.setdefault(r & ~mask, []).append(r)
        out.append([groups[g] for g in sorted(groups)])
    return out


def worker_fields(sim, warmup: int) -> dict:
    """The worker configuration fields of a decentralized experiment, from `sim` (a simfog.simulation.Simulation of
    the simulated experiment): "algorithm", "schedule" (per run iteration, warm-up first: the topology phase, or the
    WAGMA layout, -1 for a global step; run iteration i is the simulator's iteration i - warmup) and "exchanges"
    (neighbor: per phase, per rank [send_to, recv_from, self_weight, recv_weights]) or "groups" (wagma: per layout,
    its member lists). Raises ConfigError for another algorithm."""
    alg, exp = sim.algorithm, sim.experiment
    name = exp.comm.algorithm
    ks = range(-warmup, exp.iterations)
    if name == "neighbor":
        topo = alg.topo
        exchanges = [[[list(e.send_to), list(e.recv_from), e.self_weight, list(e.recv_weights)]
                      for e in topo.exchanges(p)] for p in range(topo.period)]
        return {"algorithm": name, "schedule": [k % topo.period for k in ks], "exchanges": exchanges}
    if name == "wagma":
        return {"algorithm": name, "groups": wagma_groups(alg),
                "schedule": [-1 if alg.is_global(k) else k % len(alg.layouts) for k in ks]}
    raise ConfigError("comm.algorithm", name, f"one of {', '.join(ALGORITHMS)}")


def group_of(cfg: Mapping, step: int, rank: int) -> list[int]:
    """The members of `rank`'s group at run iteration `step` of a wagma configuration (all ranks for a global one)."""
    layout = cfg["schedule"][step]
    if layout < 0:
        return list(range(sum(len(g) for g in cfg["groups"][0])))
    return next(g for g in cfg["groups"][layout] if rank in g)


def expected_messages(cfg: Mapping, step: int, rank: int, nbytes: int) -> dict:
    """What `rank` must record at run iteration `step`: neighbor {"sends": [[dst, bytes]], "recvs": [[src, bytes]]};
    wagma {"group": members}."""
    if cfg["algorithm"] == "neighbor":
        send_to, recv_from, _, _ = cfg["exchanges"][cfg["schedule"][step]][rank]
        return {"sends": [[d, nbytes] for d in send_to], "recvs": [[s, nbytes] for s in recv_from]}
    return {"group": group_of(cfg, step, rank)}


def communication_matches(cfg: Mapping, per_rank: Sequence[Mapping], nbytes: int) -> bool:
    """True when every rank sent and received exactly the scheduled messages (neighbor) or averaged in exactly its
    scheduled group (wagma) in every measured iteration."""
    warmup = cfg["warmup"]
    for rank, rec in enumerate(per_rank):
        if len(rec["iterations"]) != cfg["iterations"]:
            return False
        for it, d in enumerate(rec["iterations"]):
            want = expected_messages(cfg, warmup + it, rank, nbytes)
            if any(d.get(k) != v for k, v in want.items()):
                return False
    return True


# --- what can be validated, and how rows name it (no torch) -----------------------------------------------------------

def check_experiment(exp, mode: str) -> None:
    """Raise ConfigError for a decentralized experiment the validator cannot run (see validate.run)."""
    from simfog.topology import topology

    src, comm, algorithm = exp.source, exp.comm, exp.comm.algorithm
    if mode != "replay":
        raise ConfigError("mode", mode, f"replay for algorithm {algorithm} (the validator averages the replay "
                          "model's parameters)", source=src)
    if exp.cluster.ranks < 2:
        raise ConfigError("cluster", f"{exp.cluster.ranks} rank", f"at least 2 ranks for algorithm {algorithm}",
                          source=src)
    if algorithm == "neighbor":
        if comm.combine != "awc":
            raise ConfigError("comm.combine", comm.combine, "awc (the validator runs adapt-with-combine only)",
                              source=src)
        from simfog.algorithms.dataflow.bluefog import NeighborAveraging

        name = comm.topology or NeighborAveraging.default_topology
        if topology(name, exp.cluster.ranks, ranks_per_node=exp.cluster.ranks_per_node).intra_node is not None:
            raise ConfigError("comm.topology", name, "a topology without intra-node steps (e.g. one_peer_exp2): "
                              "the validator runs point-to-point exchanges only", source=src)
    if algorithm == "wagma" and not exp.homogeneous:
        raise ConfigError("heterogeneity", "stragglers or slowdowns", "none for algorithm wagma: the real run's "
                          "group allreduce waits for its members, simfog's wagma does not "
                          "(validate.ranks.decentralized)", source=src)


def algorithm_label(exp) -> str:
    """"allreduce", or the decentralized algorithm with its knobs as simulated ("neighbor:one_peer_exp2",
    "wagma:S2:every5"), or fsdp with its unit, reshard_after_forward and prefetch ("fsdp:layer:reshard:k1")."""
    comm = exp.comm
    if comm.algorithm == "neighbor":
        from simfog.algorithms.dataflow.bluefog import NeighborAveraging

        return f"neighbor:{comm.topology or NeighborAveraging.default_topology}"
    if comm.algorithm == "wagma":
        from simfog.algorithms.dynamic.plan import WAGMA_GLOBAL_EVERY, WAGMA_GROUP_SIZE

        return (f"wagma:S{comm.group_size or min(WAGMA_GROUP_SIZE, exp.cluster.ranks)}:"
                f"every{comm.global_every or WAGMA_GLOBAL_EVERY}")
    if comm.algorithm == "fsdp":
        unit = comm.fsdp_unit
        if isinstance(unit, tuple):
            unit = "-".join(map(str, unit))
        elif isinstance(unit, float):
            unit = f"{unit / 1e3:g}kB"
        return f"fsdp:{unit}:{'reshard' if comm.reshard_after_forward else 'keep'}:k{comm.prefetch}"
    if comm.algorithm == "zero2":
        return f"zero2:{comm.reduce_bucket_size:g}el:{'overlap' if comm.overlap_comm else 'blocking'}"
    return comm.algorithm


# --- the real communication (torch) -----------------------------------------------------------------------------------

class _Waiter:
    """A thread that waits for a list of torch.distributed works and notes when the last one completed: a gloo
    send/recv work offers no completion callback, and waiting in the rank's thread would time the completion only
    once backward is over."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="simfog-waiter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            works, box, event = item
            try:
                for w in works:
                    w.wait()
                box.append(time.perf_counter())
            except BaseException as e:  # handed to the rank's thread by wait()
                box.append(e)
            event.set()

    def submit(self, works: list) -> tuple[list, threading.Event]:
        box, event = [], threading.Event()
        self._q.put((works, box, event))
        return box, event

    @staticmethod
    def wait(box: list, event: threading.Event) -> float:
        event.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def close(self) -> None:
        """Stop the thread (at once when idle; a thread stuck on a dead peer is left to the process's end)."""
        self._q.put(None)
        self._thread.join(timeout=5.0)


class _Averaging:
    """Common part: the parameters as views into one flat buffer, the per-iteration record, the waiter thread."""

    name = ""

    def __init__(self, params: Mapping, cfg: Mapping, rank: int):
        import torch

        dtypes = {p.dtype for p in params.values()}
        if len(dtypes) != 1:
            raise ConfigError("workload.trace", sorted(map(str, dtypes)), "parameters of one dtype (one flat buffer)")
        self.cfg, self.rank = cfg, rank
        self.flat = torch.zeros(sum(p.numel() for p in params.values()), dtype=dtypes.pop())
        offset = 0
        for p in params.values():  # trace order; the replay model's values are irrelevant to its timing
            k = p.numel()
            p.data = self.flat[offset:offset + k].view_as(p)
            offset += k
        self.nbytes = self.flat.numel() * self.flat.element_size()
        self.values: list[list[float]] = []
        self._waiter = _Waiter()
        self.step = -1
        self.start_iteration()

    def start_iteration(self) -> None:
        self.launch_s = [float("nan")]
        self.done_s = [float("nan")]
        self.launch_order: list[int] = []
        self.extra: dict = {}
        self._pending = None

    def launch(self, step: int) -> None:
        """Start run iteration `step`'s communication (call at backward start)."""
        self.step = step
        self.flat[0] = self.flat[-1] = float(self.rank)  # markers: see the module docstring
        self.launch_s[0] = time.perf_counter()
        self.launch_order.append(0)
        self._pending = self._waiter.submit(self._start(step))

    def finish(self) -> None:
        """Wait for the communication and combine (call before the optimizer step)."""
        self.done_s[0] = self._waiter.wait(*self._pending)
        self._combine()
        self.values.append([float(self.flat[0]), float(self.flat[-1])])

    def record(self) -> dict:
        """This iteration's extra fields for the worker's record."""
        return {"names": [self.name], **self.extra}

    def close(self) -> None:
        self._waiter.close()


class NeighborExchange(_Averaging):
    """Neighbour averaging by isend/irecv of the flat parameters, per the configuration's exchanges."""

    name = "neighbor"

    def __init__(self, params: Mapping, cfg: Mapping, rank: int):
        super().__init__(params, cfg, rank)
        degree = max(len(ex[self.rank][1]) for ex in cfg["exchanges"])
        self.recv = [self.flat.new_empty(self.flat.shape) for _ in range(degree)]

    def _start(self, step: int) -> list:
        import torch.distributed as dist

        send_to, recv_from, self.weight, self.weights = self.cfg["exchanges"][self.cfg["schedule"][step]][self.rank]
        works = [dist.irecv(self.recv[k], src) for k, src in enumerate(recv_from)]
        works += [dist.isend(self.flat, dst) for dst in send_to]
        self.extra = {"peers": [sorted({self.rank, *send_to, *recv_from})],
                      "sends": [[d, self.nbytes] for d in send_to], "recvs": [[s, self.nbytes] for s in recv_from]}
        return works

    def _combine(self) -> None:
        self.flat.mul_(self.weight)
        for buf, w in zip(self.recv, self.weights):
            self.flat.add_(buf, alpha=w)


_GROUPS: dict[tuple[int, ...], object] = {}  # members -> process group, created once per worker process


def _process_groups(groups: Sequence[Sequence[Sequence[int]]]) -> None:
    """Create the process groups of every layout, on every rank in the same order (dist.new_group is collective
    over the world: non-members take part too)."""
    import torch.distributed as dist

    for layout in groups:
        for members in layout:
            key = tuple(members)
            if key not in _GROUPS:
                _GROUPS[key] = dist.new_group(list(key))


class GroupAverage(_Averaging):
    """WAGMA's group (and periodic global) model averaging as blocking gloo allreduces (see the module docstring)."""

    def __init__(self, params: Mapping, cfg: Mapping, rank: int):
        super().__init__(params, cfg, rank)
        _process_groups(cfg["groups"])
        self.buf = self.flat.new_empty(self.flat.shape)

    def _start(self, step: int) -> list:
        import torch.distributed as dist

        members = group_of(self.cfg, step, self.rank)
        glob = self.cfg["schedule"][step] < 0
        self.name = "global" if glob else "group"
        self.buf.copy_(self.flat).div_(len(members))  # a copy: x changes only when the average is taken
        self.extra = {"peers": [members], "group": members}
        return [dist.all_reduce(self.buf, group=None if glob else _GROUPS[tuple(members)], async_op=True)]

    def _combine(self) -> None:
        self.flat.copy_(self.buf)


def make(cfg: Mapping, params: Mapping, rank: int) -> _Averaging:
    """The averaging object of a decentralized worker configuration (cfg["algorithm"] in ALGORITHMS)."""
    kinds = {"neighbor": NeighborExchange, "wagma": GroupAverage}
    if cfg.get("algorithm") not in kinds:
        raise ConfigError("algorithm", cfg.get("algorithm"), f"one of {', '.join(kinds)}")
    return kinds[cfg["algorithm"]](params, cfg, rank)
