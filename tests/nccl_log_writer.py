"""Synthetic nccl-tests logs for the importer tests, written with nccl-tests' own printf formats.

Nothing here is measured: the times come from a made-up latency + size/bandwidth formula. Only the layout is
real; it follows NVIDIA/nccl-tests at three points of its history:

- "old": f773748 (2021-09) src/common.cu and src/<test>.cu print_header/print_line_header;
- "middle": d313d20 (2022-09) src/common.cu (root column, #wrong, `Group` in the device lines, agg iters/graph);
  `middle-empty-redop` is 51af557 (2022-08), where all_gather printed an empty redop;
- "new": a0b82b2 (2026-07, nccl-tests 2.19.6) src/util.cu writeDeviceReport / writeResultHeader /
  writeBenchmarkLinePreamble / writeBenchmarkLineBody (getFloatStr) / writeResultFooter.
"""

# ruff: noqa: UP031  (nccl-tests' printf formats, kept as they are in its C source)
from __future__ import annotations

PROGRAM = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf", "reduce_scatter": "reduce_scatter_perf",
           "broadcast": "broadcast_perf", "reduce": "reduce_perf", "alltoall": "alltoall_perf",
           "sendrecv": "sendrecv_perf"}
BUS_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}
TYPE_SIZE = {"float": 4, "double": 8, "half": 2, "int32": 4, "int8": 1}
# old format: what print_line_header printed between type and the times (f773748 src/<test>.cu)
OLD_PREFIX = {"allreduce": ("redop",), "reduce_scatter": ("redop",), "alltoall": ("redop",), "allgather": (),
              "sendrecv": (), "broadcast": ("root",), "reduce": ("redop", "root")}
NO_REDOP = ("allgather", "broadcast", "alltoall")  # TimeTest(..., "none", ...) in the middle and new formats
ROOTED = ("broadcast", "reduce")


def time_us(collective: str, nbytes: int, ranks: int, in_place: bool = False) -> float:
    """Made-up time: 6 us + 0.4 us per rank + bytes at 80 GB/s bus bandwidth (in-place 1 % faster)."""
    t = 6.0 + 0.4 * ranks + nbytes * BUS_FACTOR[collective](ranks) / 80e3
    return t * (0.99 if in_place else 1.0)


def _time_str(us: float) -> str:
    """old and middle formats (common.cu BenchTime)."""
    return f"{us:7.0f}" if us >= 10000.0 else (f"{us:7.1f}" if us >= 100.0 else f"{us:7.2f}")


def _float_str(value: float, width: int) -> str:
    """new format: util.cu getFloatStr."""
    for fmt in (f"{{:{width}.2f}}", f"{{:{width}.1f}}", f"{{:{width}.0f}}"):
        s = fmt.format(value)
        if len(s) <= width:
            return s
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def run_lines(fmt: str, collective: str, *, sizes, hosts=("node01",), gpus_per_node=8,
              gpu="NVIDIA A100-SXM4-80GB", dtype="float", validation=True, cut_after: int | None = None,
              per_iter: bool = False, stamps: bool = False, ranks_per_host=None, nccl_info: str = "") -> list[str]:
    """The lines one nccl-tests run prints (no trailing newlines). `cut_after` rows: the log ends there, mid-row
    (truncated: no footer). `ranks_per_host` overrides the uniform layout, e.g. (4, 2)."""
    per_host = list(ranks_per_host or [gpus_per_node] * len(hosts))
    ranks = sum(per_host)
    new, middle = fmt == "new", fmt.startswith("middle")
    lines = []
    if new:
        lines += ["# nccl-tests version 2.19.6 nccl-headers=22903 nccl-library=22903",
                  f"# Collective test starting: {PROGRAM[collective]}"]
    check = 1 if validation else 0
    if fmt == "old":
        lines.append(f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) warmup iters: 5 "
                     f"iters: 20 validation: {check} ")
    elif middle:
        lines.append(f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) warmup iters: 5 "
                     f"iters: 20 agg iters: 1 validation: {check} graph: 0")
    else:
        lines.append(f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 2(factor) warmup iters: 5 "
                     f"iters: 20 agg iters: 1 validation: {check} graph: 0 unalign: 0")
    if per_iter:
        lines.append("# Per-Iteration Report: CUDA event timing; i_* uses max over process rows ")
    lines += ["#", "# Using devices"]
    rank = 0
    for h, n in zip(hosts, per_host, strict=True):
        for dev in range(n):
            pid = 40000 + rank
            if fmt == "old" or fmt == "middle-empty-redop":
                lines.append("#   Rank %2d Pid %6d on %10s device %2d [0x%02x] %s" % (rank, pid, h, dev, 7 + dev, gpu))
            elif middle:
                lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
                             % (rank, 0, pid, h, dev, 7 + dev, gpu))
            else:
                lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
                             % (rank, 0, pid, h, dev, 0, 7 + dev, 0, gpu))
            rank += 1
    if nccl_info:
        lines.append(nccl_info)
    lines.append("#")
    if fmt == "old":
        cols = OLD_PREFIX[collective]
        pad = "  %6s" * len(cols)
        lines.append(("# %10s  %12s  %8s" + pad + "            out-of-place                       in-place          ")
                     % ("", "", "", *[""] * len(cols)))
        lines.append(("# %10s  %12s  %8s" + pad + "  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s")
                     % ("size", "count", "type", *cols, "time", "algbw", "busbw", "error", "time", "algbw", "busbw",
                        "error"))
        lines.append(("# %10s  %12s  %8s" + pad + "  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s")
                     % ("(B)", "(elements)", "", *[""] * len(cols), "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                        "(GB/s)", ""))
    elif middle:
        lines.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
                     % ("", "", "", "", ""))
        lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
                     % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                        "algbw", "busbw", "#wrong"))
        lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
                     % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
                        ""))
    elif per_iter:
        lines.append("# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                     "
                     "           in-place (+ per-iteration)" % ("", "", "", "", ""))
        lines.append(("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  "
                      "%7s  %7s  %7s  %7s %*s")
                     % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min",
                        "i_max", "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99",
                        "i_cv%", 0, ""))
    else:
        ts_pad, ts_label = (19, "timestamp") if stamps else (0, "")
        lines.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
                     % ("", "", "", "", ""))
        lines.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
                     % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                        "busbw", "#wrong", ts_pad, ts_label))
    bus_sum = 0.0
    for i, size in enumerate(sizes):
        count = size // TYPE_SIZE[dtype]
        root = 0 if collective in ROOTED else -1
        if fmt == "old":
            prefix = "%12i  %12i  %8s" % (size, count, dtype)
            for c in OLD_PREFIX[collective]:
                prefix += "  %6s" % "sum" if c == "redop" else "  %6i" % root
        else:
            redop = ("" if fmt == "middle-empty-redop" else "none") if collective in NO_REDOP else "sum"
            prefix = "%12i  %12i  %8s  %6s  %6s" % (size, count, dtype, redop, "%6i" % root)
        halves = []
        for in_place in (False, True):
            t = time_us(collective, size, ranks, in_place)
            alg = size / t / 1e3
            bus = alg * BUS_FACTOR[collective](ranks)
            if not in_place:
                bus_sum += bus
            if fmt == "old":
                err = "%5.0e" % 2e-07 if validation else "%5s" % "N/A"
                halves.append("  %7s  %6.2f  %6.2f  %s" % (_time_str(t), alg, bus, err))
            elif middle:
                err = "%5g" % 0 if validation else "%5s" % "N/A"
                halves.append("  %7s  %6.2f  %6.2f  %s" % (_time_str(t), alg, bus, err))
            else:
                err = "  %6g" % 0 if validation else "    N/A"
                half = "  %7s  %6s  %6s%s" % (_float_str(t, 7), _float_str(alg, 6), _float_str(bus, 6), err)
                if per_iter:
                    half += "  %7s  %7s  %7s  %7s" % (_float_str(t * 0.9, 7), _float_str(t * 1.3, 7),
                                                      _float_str(t * 1.2, 7), _float_str(4.25, 7))
                halves.append(half)
        row = prefix + "".join(halves) + ("%21s" % "2026-07-09 10:11:12" if stamps and new else "")
        if cut_after is not None and i == cut_after:
            lines.append(row[: len(row) // 2])  # the log ends inside this row
            return lines
        lines.append(row)
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {bus_sum / len(sizes):g} ", "#"]
    if new:
        lines += [f"# Collective test concluded: {PROGRAM[collective]}", "#", ""]
    elif middle:
        lines += [""]
    return lines


def log_text(*runs: list[str], tags: bool = False, crlf: bool = False, preamble=()) -> str:
    """Join runs into a log; `tags`: Open MPI --tag-output prefixes; `crlf`: Windows line endings."""
    lines = list(preamble) + [line for run in runs for line in run]
    if tags:
        lines = ["[1,0]<stdout>:" + line for line in lines]
    return ("\r\n" if crlf else "\n").join(lines) + ("\r\n" if crlf else "\n")
