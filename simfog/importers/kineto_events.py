"""Reading a PyTorch profiler (Kineto) Chrome trace into nested events, iterations and collectives.

The layer attribution built on top of this lives in kineto.py. Formats and quirks, as real traces of NCCL and gloo
DDP runs show them: two time bases, string pids, duplicate thread names, comm metadata only in newer traces, gloo
work on `pt_gloo_runloop` threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from simfog import files
from simfog.errors import ConfigError

EXPECTED = "a PyTorch profiler (Kineto) Chrome-trace JSON (.json or .json.gz) with a traceEvents list"
CPU_CATS = ("cpu_op", "user_annotation", "python_function")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM_PREFIXES = ("c10d::", "record_param_comms", "nccl:", "gloo:", "mpi:", "ProcessGroup")
# record_param_comms "Collective name" / c10d op / gloo annotation -> simfog collective (None: not a transfer).
_COLLECTIVE = {"allreduce": "allreduce", "allreducecoalesced": "allreduce", "broadcast": "broadcast",
               "allgather": "allgather", "allgatherbase": "allgather", "allgatherintotensorcoalesced": "allgather",
               "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
               "reducescattertensorcoalesced": "reduce_scatter", "reduce": "reduce", "alltoall": "alltoall",
               "alltoallbase": "alltoall", "send": "sendrecv", "recv": "sendrecv", "sendrecv": "sendrecv"}
# Torch scalar type names (record_param_comms "dtype") and C++ names (record_shapes "Input type") -> simfog dtype.
DTYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64", "long": "int64",
          "int": "int32", "byte": "uint8", "char": "int8", "c10::half": "float16", "c10::bfloat16": "bfloat16",
          "long int": "int64", "int64_t": "int64", "unsigned char": "uint8", "signed char": "int8"}


@dataclass(eq=False)
class Event:
    """One complete ('X') event; times in µs as in the file. Links are filled by `Trace`."""

    name: str
    cat: str
    thread: tuple
    ts: float
    dur: float
    args: dict
    parent: Event | None = None   # nearest enclosing cpu_op
    top: Event | None = None      # outermost cpu_op around it (itself when it is one)
    module: Event | None = None   # innermost nn.Module call around it (python_function), if recorded
    comm: bool = False            # a communication op, or inside one
    subtree: list = field(default_factory=list)  # top-level cpu_ops only: every cpu_op inside, itself included
    gpu_us: float = 0.0           # top-level cpu_ops only: GPU work launched from the subtree, comm excluded
    gpu_end: float | None = None  # top-level cpu_ops only: when the last of that GPU work ended (µs)
    comm_gpu: list = field(default_factory=list)  # GPU work of the comm ops launched from the subtree

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def seq(self) -> int | None:
        return _id(self.args.get("Sequence number"))


def load(path: str) -> dict:
    """The parsed trace. ConfigError naming the file for a truncated/corrupt file or another kind of file."""
    try:
        text = files.read_text(path)
    except ConfigError as e:
        if not e.allowed.startswith(("a readable file", "a UTF-8")):  # missing, a directory, a FIFO, too large
            raise
        raise ConfigError("file", "(unreadable)", f"{EXPECTED}, complete: it is truncated or corrupt ({e.allowed})",
                          source=path) from None
    if not text.lstrip().startswith("{"):
        raise ConfigError("format", text.lstrip()[:40], EXPECTED, source=path)
    data = files.parse_json(text, path, f"{EXPECTED}, complete: it is truncated or corrupt")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError("traceEvents", "(missing)", EXPECTED, source=path)
    return data


def is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def collective_of(name: str) -> str | None:
    key = name.split("::")[-1].split(":")[-1].lower().replace("_", "").replace("-", "")
    return _COLLECTIVE.get(key)


def first_arg(args: dict, key: str):
    """The first entry of a record_shapes list argument ("Input Dims", "Input type"); None when it is absent or
    not a non-empty list (hand-edited or damaged traces)."""
    value = args.get(key)
    return value[0] if isinstance(value, list) and value else None


def is_dim(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def elements_of(dims) -> int | None:
    """Elements of a record_shapes 'Input Dims' first argument: a tensor [N, M] or a tensor list [[N], [M]];
    None for anything else (negative or non-integer sizes included)."""
    if not isinstance(dims, list) or not dims:
        return None
    if all(is_dim(d) for d in dims):
        return math.prod(dims)
    if all(isinstance(d, list) and all(is_dim(x) for x in d) for d in dims):
        return sum(math.prod(d) for d in dims)
    return None


def _id(value) -> int | str | None:
    """An id-like event argument ("Sequence number", "External id") usable as a key; None when it is a list,
    an object or absent."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def _time(value) -> float | None:
    """A finite µs time from an event field, else None (strings, booleans, NaN, numbers beyond a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _is_module_call(e: Event) -> bool:
    return e.cat == "python_function" and (e.name.startswith("nn.Module: ") or e.name.endswith(": _call_impl"))


class Trace:
    """Events of one trace, nested per thread: tops, modules, comm flags, GPU work per top-level op."""

    def __init__(self, data: dict, path: str):
        self.data, self.path = data, path
        self.cpu: list[Event] = []
        self.gpu: list[Event] = []
        for raw in data["traceEvents"]:
            if not isinstance(raw, dict) or raw.get("ph") != "X" or raw.get("cat") not in CPU_CATS + GPU_CATS:
                continue
            ts, dur = _time(raw.get("ts")), _time(raw.get("dur", 0))
            if ts is None or dur is None or dur < 0:  # not a usable event (damaged or hand-edited)
                continue
            args = raw.get("args") if isinstance(raw.get("args"), dict) else {}
            e = Event(str(raw.get("name", "")), raw["cat"], (raw.get("pid"), raw.get("tid")), float(ts),
                      float(dur), args)
            (self.cpu if e.cat in CPU_CATS else self.gpu).append(e)
        self.cpu.sort(key=lambda e: (str(e.thread), e.ts, -e.dur))
        self._nest()
        self._link_gpu()

    def _nest(self) -> None:
        stack: list[Event] = []
        thread = None
        for e in self.cpu:
            if e.thread != thread:
                stack, thread = [], e.thread
            while stack and stack[-1].end <= e.ts:
                stack.pop()
            modules = [s for s in stack if _is_module_call(s)]
            e.module = modules[-1] if modules else None
            if e.cat == "cpu_op":
                e.parent = next((s for s in reversed(stack) if s.cat == "cpu_op"), None)
                e.top = e.parent.top if e.parent else e
                e.top.subtree.append(e)
                e.comm = is_comm(e.name) or bool(e.parent and e.parent.comm)
            elif e.cat == "user_annotation":
                e.comm = is_comm(e.name)
            stack.append(e)

    def _link_gpu(self) -> None:
        by_id = {_id(e.args.get("External id")): e for e in self.cpu if e.cat == "cpu_op"}
        by_id.pop(None, None)
        for g in self.gpu:
            op = by_id.get(_id(g.args.get("External id")))
            if op is None or op.top is None:
                continue
            if op.comm or "nccl" in g.name.lower():
                op.top.comm_gpu.append((op, g))
            else:
                op.top.gpu_us += g.dur
                op.top.gpu_end = max(op.top.gpu_end or g.end, g.end)

    def annotations(self, prefix: str) -> list[Event]:
        return [e for e in self.cpu if e.cat == "user_annotation" and e.name.startswith(prefix)]

    def tops(self, thread=None) -> list[Event]:
        """Top-level cpu_ops (optionally of one thread), in time order."""
        out = [e for e in self.cpu if e.cat == "cpu_op" and e.top is e and (thread is None or e.thread == thread)]
        return sorted(out, key=lambda e: e.ts)

    def main_thread(self) -> tuple:
        """The thread that runs the training loop: the one with ProfilerStep/optimizer annotations, else the one
        with the most forward ops (ops with an autograd sequence number)."""
        marks = self.annotations("ProfilerStep#") or self.annotations("Optimizer.step#")
        if marks:
            return marks[0].thread
        counts: dict = {}
        for e in self.cpu:
            if e.cat == "cpu_op" and e.seq is not None and not e.name.startswith("autograd::engine"):
                counts[e.thread] = counts.get(e.thread, 0) + 1
        if not counts:
            raise ConfigError("traceEvents", "(no operators with autograd sequence numbers)",
                              f"{EXPECTED}, recording training iterations (forward and backward)", source=self.path)
        return max(counts, key=counts.get)

    def windows(self, main: tuple) -> list[tuple[str, float, float]]:
        """(name, start_us, end_us) per iteration: ProfilerStep#N spans, else the spans ending with each
        Optimizer.step (traces recorded without a profiler schedule have no step markers)."""
        steps = sorted((e for e in self.annotations("ProfilerStep#") if e.thread == main), key=lambda e: e.ts)
        for a, b in zip(steps, steps[1:]):
            if b.ts < a.end:  # iterations run one after another: overlapping steps are a damaged trace
                raise ConfigError("traceEvents", f"{b.name} at ts {b.ts:g} us", f"{EXPECTED}, whose ProfilerStep# "
                                  f"spans do not overlap (this one starts before {a.name} ends at {a.end:g} us: an "
                                  "event listed twice?)", source=self.path)
        if steps:
            return [(e.name, e.ts, e.end) for e in steps]
        opt = sorted((e for e in self.annotations("Optimizer.step#") if e.thread == main), key=lambda e: e.ts)
        if not opt:
            raise ConfigError("iterations", "(no ProfilerStep# or Optimizer.step# annotations)",
                              f"{EXPECTED}, with iteration markers (prof.step() or a torch.optim optimizer)",
                              source=self.path)
        out, prev = [], -math.inf
        for i, e in enumerate(opt):
            inside = [t.ts for t in self.cpu if t.thread == main and prev < t.ts <= e.end]
            if not inside:  # it ends where the one before ended
                raise ConfigError("traceEvents", f"{e.name} at ts {e.ts:g} us", f"{EXPECTED}, whose Optimizer.step# "
                                  "spans each end after the one before (this one does not: an event listed twice?)",
                                  source=self.path)
            out.append((f"iteration {i + 1}", min(inside), e.end))
            prev = e.end
        return out


@dataclass
class Collective:
    """One collective as the trace shows it; times in µs (absolute, as in the file)."""

    collective: str
    elements: int | None
    dtype: str | None
    group_size: int | None
    issue: Event
    start_us: float | None = None
    duration_us: float | None = None


def collectives(trace: Trace) -> list[Collective]:
    """Every data-moving collective: from record_param_comms metadata when the trace has it (NCCL, 2024+),
    else from the outermost c10d:: ops and their Input Dims (gloo). Execution time: the NCCL kernel launched
    by the op, else the matching gloo:<name> annotation of a gloo worker thread (paired in order, per name)."""
    rpc = [e for e in trace.cpu if e.name == "record_param_comms" and e.args.get("Collective name")]
    out = []
    if rpc:
        for e in sorted(rpc, key=lambda e: e.ts):
            coll = collective_of(str(e.args["Collective name"]))
            if coll is None:
                continue  # "wait", "barrier", ...: nothing to transfer
            c = Collective(coll, e.args.get("In msg nelems"), DTYPES.get(str(e.args.get("dtype", "")).lower()),
                           e.args.get("Group size"), e)
            out.append(c)
    else:
        for e in sorted((e for e in trace.cpu if e.cat == "cpu_op" and e.name.startswith("c10d::")),
                        key=lambda e: e.ts):
            coll = collective_of(e.name)
            if coll is None or (e.parent is not None and e.parent.comm):
                continue
            # The input's shape and type (as record_param_comms' "In msg nelems"): the first argument, but the
            # second for the flat allgathers, whose first argument is the gathered output.
            k = 1 if "allgather_base" in e.name or "allgather_into_tensor" in e.name else 0
            dims, types = e.args.get("Input Dims"), e.args.get("Input type")
            dims = dims[k] if isinstance(dims, list) and len(dims) > k else None
            dtype = types[k] if isinstance(types, list) and len(types) > k else None
            out.append(Collective(coll, elements_of(dims), DTYPES.get(str(dtype).lower()), None, e))
    kernels = {id(op): g for top in trace.tops() for op, g in reversed(top.comm_gpu)}  # first kernel per op
    work = {}
    for a in sorted((e for e in trace.cpu if e.cat == "user_annotation" and e.name.startswith("gloo:")),
                    key=lambda e: e.ts):
        work.setdefault(collective_of(a.name), []).append(a)
    marks = [e for e in trace.cpu if e.cat == "user_annotation" and e.comm]
    for c in out:
        if c.elements is None:   # older NCCL traces: only the nccl:<name> annotation inside has the shape
            a = next((a for a in marks if a.thread == c.issue.thread and c.issue.ts <= a.ts <= c.issue.end), None)
            if a is not None:
                c.elements = elements_of(first_arg(a.args, "Input Dims"))
                c.dtype = c.dtype or DTYPES.get(str(first_arg(a.args, "Input type")).lower())
    used: dict = {}
    for c in out:
        inside = [c.issue] + [s for s in c.issue.top.subtree if _under(s, c.issue)]
        g = next((kernels[id(s)] for s in inside if id(s) in kernels), None)
        if g is None and work.get(c.collective):
            k = used.get(c.collective, 0)
            if k < len(work[c.collective]):
                g = work[c.collective][k]
                used[c.collective] = k + 1
                c.elements = c.elements or elements_of(first_arg(g.args, "Input Dims"))
                c.dtype = c.dtype or DTYPES.get(str(first_arg(g.args, "Input type")).lower())
        if g is not None:
            c.start_us, c.duration_us = g.ts, g.dur
    return out


def _under(e: Event, ancestor: Event) -> bool:
    while e.parent is not None:
        e = e.parent
        if e is ancestor:
            return True
    return False

