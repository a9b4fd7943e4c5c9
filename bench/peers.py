"""simfog beside ASTRA-sim's analytical backend on the same workloads: wall time of each, their ratio, and the
difference of their predicted iteration times, each difference explained.

    python bench/peers.py --astra-sim ~/src/astra-sim            # builds once into ~/.cache/simfog-peers, then runs
    python bench/peers.py --astra-sim ~/src/astra-sim --ranks 8,64,512

What runs: `simfog export chakra` writes the experiment (default: bench/peers-resnet50-a100.toml, ResNet-50 on
A100s ESTIMATED, 8 GPUs per node, 25 Gbit/s NICs, compute at the layers' means) at 8, 64, 512, 2,048 and 8,192 ranks,
with the ring and the hierarchical (two-level) allreduce and PyTorch DDP's buckets or MG-WFBP's merging, as Chakra
traces plus ASTRA-sim's network and system inputs; ASTRA-sim's analytical, congestion-unaware backend runs them;
simfog simulates the same experiment (one iteration, as the traces hold). Each row: both wall times (simfog: the
simulation in this process; ASTRA-sim: its process, reading the traces included; the export itself is in
neither), their ratio, both iteration times and their difference, and what explains it: Chakra holds durations in
whole microseconds (simfog exports each layer's mean rounded), and ASTRA-sim adds its least endpoint delay (1 ns)
to every message and keeps message times in whole nanoseconds; the row's bound is the sum of those, and a
difference within it is marked "explained". Rows ASTRA-sim cannot hold in this machine's memory are skipped with
the reason: its logical ring topologies keep every member of every ring in each NPU (4 collectives x ranks x ring
size map entries), which for one flat ring of 8,192 NPUs is tens of GB. The last line:

    ranks=<max> speed_ratio_min=<x> speed_ratio_8192=<x> max_diff=<pct>

speed_ratio_min is the least ratio over the rows at 2,048 ranks and above (the target: simfog >= 100x faster
there), speed_ratio_8192 the least at 8,192 ranks, max_diff the largest |difference| in percent over every row
(both model the same thing in every row: target within 1 %). Ratios are wall-clock times: measured on a loaded
machine they say so; rerun on an idle one for figures to quote.

ASTRA-sim source: astra-sim/astra-sim at commit c459ab61193bdb5b663ab61d2e923314dae8a77f (2025-08-11, "Merge pull
request #333"), with the submodules it pins that the analytical backend builds from:

    git clone https://github.com/astra-sim/astra-sim && cd astra-sim
    git checkout c459ab61193bdb5b663ab61d2e923314dae8a77f
    git submodule update --init extern/graph_frontend/chakra extern/network_backend/analytical \\
        extern/remote_memory_backend/analytical extern/helper/fmt extern/helper/spdlog
    git -C extern/network_backend/analytical submodule update --init extern/yaml-cpp

(chakra 214f2c55, astra-network-analytical 599a0473 with yaml-cpp 3d2888cc, astra-memory-analytical 641cce85,
fmt 7e73566c, spdlog 63f08750). The build needs cmake >= 3.15, a C++17 compiler and protobuf's compiler and
headers (Debian/Ubuntu: apt-get install cmake g++ protobuf-compiler libprotobuf-dev). The source tree is copied
into the cache folder (its et_def.pb.* are generated there, so the given tree is never written), configured with
BUILDTARGET=congestion_unaware and built; a later run with the same tree reuses the binary (--rebuild forces).
Nothing of ASTRA-sim is in this repository. Without a source tree, a submodule or a tool, the bench says which
and stops (exit 2). It is never part of the test command.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ASTRA_COMMIT = "c459ab61193bdb5b663ab61d2e923314dae8a77f"
BINARY = "AstraSim_Analytical_Congestion_Unaware"
RANKS = (8, 64, 512, 2048, 8192)
COLLECTIVES = ("ring", "hierarchical")
MERGES = ("ddp", "mgwfbp")
TOOLS = ("cmake", "protoc", "make")
# What the build reads from the tree, and the submodule each comes from.
NEEDED = {"CMakeLists.txt": "the ASTRA-sim tree itself",
          "build/astra_analytical/CMakeLists.txt": "the ASTRA-sim tree itself",
          "extern/graph_frontend/chakra/schema/protobuf/et_def.proto": "extern/graph_frontend/chakra",
          "extern/network_backend/analytical/CMakeLists.txt": "extern/network_backend/analytical",
          "extern/network_backend/analytical/extern/yaml-cpp/CMakeLists.txt":
              "extern/network_backend/analytical's extern/yaml-cpp",
          "extern/remote_memory_backend/analytical/AnalyticalRemoteMemory.cc":
              "extern/remote_memory_backend/analytical",
          "extern/helper/fmt/CMakeLists.txt": "extern/helper/fmt",
          "extern/helper/spdlog/CMakeLists.txt": "extern/helper/spdlog"}
# Bytes per member of ASTRA-sim's logical rings (two std::map<int, int> per ring, each NPU holding its own), to
# refuse a row before it exhausts the machine: one flat ring of 2,048 NPUs peaked at 3.39 GB (4 x 2048 x 2048
# members, ~200 B each; measured here with /usr/bin/time).
RING_ENTRY_BYTES = 200
MEMORY_SHARE = 0.7  # of MemAvailable, the most a row may need (estimated) and ASTRA-sim may take (its RLIMIT_AS)
FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")


def missing(tree: Path | None) -> list[str]:
    """What the bench lacks to build ASTRA-sim: tools on PATH, the tree, files of its submodules."""
    out = [f"{t} (on PATH)" for t in TOOLS if shutil.which(t) is None]
    if shutil.which("c++") is None and shutil.which("g++") is None:
        out.append("a C++17 compiler (c++ or g++ on PATH)")
    if tree is None:
        return [*out, "an ASTRA-sim source tree (--astra-sim DIR; see this file's docstring)"]
    if not tree.is_dir():
        return [*out, f"{tree}: not a folder"]
    seen = set()
    for path, what in NEEDED.items():
        if not (tree / path).is_file() and what not in seen:
            seen.add(what)
            how = ("not an ASTRA-sim source tree?" if what == "the ASTRA-sim tree itself" else
                   f"from {what}: git submodule update --init")
            out.append(f"{tree / path} ({how})")
    return out


def build(tree: Path, cache: Path, *, rebuild: bool, jobs: int) -> Path:
    """ASTRA-sim's congestion-unaware analytical binary built from `tree` in cache/astra-sim-<hash of the tree's
    path>/ (reused when built before). Exits with the build log's tail when the build fails."""
    home = cache / f"astra-sim-{hashlib.sha256(str(tree.resolve()).encode()).hexdigest()[:12]}"
    binary = home / "src" / "build" / "astra_analytical" / "build" / "bin" / BINARY
    if binary.is_file() and not rebuild:
        print(f"ASTRA-sim: {binary} (built before; --rebuild to build again)")
        return binary
    shutil.rmtree(home / "src", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    print(f"ASTRA-sim: copying {tree} into {home / 'src'} and building (minutes) ...", flush=True)
    shutil.copytree(tree, home / "src", ignore=shutil.ignore_patterns(".git"), symlinks=True)
    proto = home / "src" / "extern" / "graph_frontend" / "chakra" / "schema" / "protobuf"
    build_dir = binary.parents[1]
    build_dir.mkdir(parents=True, exist_ok=True)
    log = home / "build.log"
    steps = [(["protoc", "et_def.proto", f"--proto_path={proto}", f"--cpp_out={proto}"], proto),
             (["cmake", "..", "-DBUILDTARGET=congestion_unaware", "-DCMAKE_BUILD_TYPE=Release"], build_dir),
             (["cmake", "--build", ".", "-j", str(jobs)], build_dir)]
    with open(log, "w") as f:
        for cmd, cwd in steps:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            if subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                break
    if not binary.is_file():
        tail = log.read_text().splitlines()[-15:]
        sys.exit("ASTRA-sim did not build; the end of " + str(log) + ":\n" + "\n".join(tail))
    return binary


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (bytes), or a large number where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 60


def ring_bytes(ranks: int, dims: list[int]) -> int:
    """What ASTRA-sim's logical rings take: in each NPU, 4 collective types x every member of each of its rings."""
    return 4 * ranks * sum(dims) * RING_ENTRY_BYTES


def run_astra(binary: Path, folder: Path, ranks: int, limit_bytes: int) -> tuple[float, float]:
    """(wall seconds, predicted iteration seconds: the last rank's finish) of ASTRA-sim on an exported folder, its
    address space limited to `limit_bytes` (so that a row too big for the machine fails alone). RuntimeError
    saying why when it does not finish every rank."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    with tempfile.TemporaryDirectory(prefix="astra-run-") as cwd:  # it writes log/ into its working folder
        start = time.perf_counter()
        done = subprocess.run([str(binary), f"--workload-configuration={folder}/workload",
                               f"--system-configuration={folder}/system.json",
                               f"--network-configuration={folder}/network.yml",
                               f"--remote-memory-configuration={folder}/memory.json"],
                              cwd=cwd, capture_output=True, text=True, preexec_fn=limit)
        wall = time.perf_counter() - start
    cycles = {int(r): int(c) for r, c in FINISHED.findall(done.stdout)}
    if done.returncode != 0 or len(cycles) != ranks:
        why = "out of memory" if "bad_alloc" in done.stderr + done.stdout else f"exit {done.returncode}"
        raise RuntimeError(f"ASTRA-sim stopped ({why}, limit {limit_bytes / 1e9:.0f} GB, {len(cycles)} of {ranks} "
                           f"ranks finished): {(done.stderr or done.stdout)[-200:].strip()}")
    return wall, max(cycles.values()) * 1e-9


def explain(exp, buckets: int, dims: list[int]) -> tuple[float, str]:
    """The most the two may differ by what only the formats and ASTRA-sim's clock add (seconds), and how."""
    import numpy as np

    trace = exp.workload.trace
    times = [np.mean(x.forward_s) for x in trace.layers] + [np.mean(x.backward_s) for x in trace.layers]
    times.append(np.mean(trace.optimizer_s) if trace.optimizer_s else 0.0)
    rounding = float(sum(abs(round(t * 1e6) * 1e-6 - t) for t in times))
    steps = buckets * sum(2 * (d - 1) for d in dims)
    clock = steps * 2e-9
    return rounding + clock, (f"durations in whole us (Chakra) <= {rounding * 1e6:.1f} us; 1 ns endpoint delay + "
                              f"whole-ns messages over {steps} ring steps <= {clock * 1e6:.1f} us")


def rows(binary: Path, base, ranks_list, work: Path):
    from simfog.exporters import astra_sim, export_chakra
    from simfog.simulation import simulate

    for ranks in ranks_list:
        for collective in COLLECTIVES:
            for merge in MERGES:
                exp = dataclasses.replace(base.with_ranks(ranks), iterations=1).with_comm(collective=collective,
                                                                                           merge=merge)
                dims = [d.npus for d in astra_sim.config(exp.cluster, collective).dimensions]
                row = {"ranks": ranks, "collective": collective, "merge": merge}
                need, have = ring_bytes(ranks, dims), available_bytes()
                if need > MEMORY_SHARE * have:
                    yield {**row, "skipped": f"ASTRA-sim's logical rings need ~{need / 1e9:.0f} GB "
                           f"(4 x {ranks} NPUs x ring of {'+'.join(map(str, dims))} members), "
                           f"{have / 1e9:.0f} GB available"}
                    continue
                folder = work / f"{ranks}-{collective}-{merge}"
                done = export_chakra(exp, folder, exact=False)  # Chakra's fields only: ASTRA-sim holds them all
                start = time.perf_counter()
                ours = simulate(exp).summary()["iteration_time_s"]
                ours_wall = time.perf_counter() - start
                try:
                    theirs_wall, theirs = run_astra(binary, folder, ranks, int(MEMORY_SHARE * available_bytes()))
                except RuntimeError as e:
                    yield {**row, "skipped": str(e)}
                    continue
                finally:
                    shutil.rmtree(folder)
                bound, why = explain(exp, done.collectives, dims)
                diff = theirs - ours
                yield {**row, "buckets": done.collectives, "simfog_wall_s": ours_wall, "astra_wall_s": theirs_wall,
                       "ratio": theirs_wall / ours_wall, "simfog_s": ours, "astra_s": theirs,
                       "diff_pct": 100 * diff / ours, "explained": abs(diff) <= bound,
                       "why": f"{diff * 1e6:+.2f} us; bound {bound * 1e6:.1f} us: {why}"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--astra-sim", type=Path, metavar="DIR", help="ASTRA-sim source tree with its submodules")
    parser.add_argument("--experiment", default=str(REPO / "bench" / "peers-resnet50-a100.toml"),
                        help="experiment TOML (default: %(default)s)")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="comma-separated rank counts")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("SIMFOG_PEERS_CACHE",
                                                                          "~/.cache/simfog-peers")).expanduser())
    parser.add_argument("--rebuild", action="store_true", help="build ASTRA-sim again")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="build jobs")
    args = parser.parse_args(argv)
    lacking = missing(args.astra_sim)
    if lacking:
        print("bench/peers.py needs:\n  " + "\n  ".join(lacking), file=sys.stderr)
        return 2
    binary = build(args.astra_sim, args.cache, rebuild=args.rebuild, jobs=args.jobs)

    from simfog import experiment

    base = experiment.load(args.experiment)
    ranks_list = [int(r) for r in args.ranks.split(",")]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at the start (a loaded machine slows both, "
          "unevenly: quote ratios measured on an idle one)")
    print(f"{'ranks':>6} {'collective':<12} {'merge':<7} {'bkts':>4} {'simfog s':>9} {'ASTRA s':>9} {'ratio':>8} "
          f"{'simfog iter':>12} {'ASTRA iter':>12} {'diff':>9}  explained")
    done = []
    with tempfile.TemporaryDirectory(prefix="simfog-peers-") as work:
        for row in rows(binary, base, ranks_list, Path(work)):
            if "skipped" in row:
                print(f"{row['ranks']:>6} {row['collective']:<12} {row['merge']:<7} skipped: {row['skipped']}")
                continue
            done.append(row)
            print(f"{row['ranks']:>6} {row['collective']:<12} {row['merge']:<7} {row['buckets']:>4} "
                  f"{row['simfog_wall_s']:>9.3f} {row['astra_wall_s']:>9.2f} {row['ratio']:>7.0f}x "
                  f"{row['simfog_s'] * 1e3:>9.4f} ms {row['astra_s'] * 1e3:>9.4f} ms {row['diff_pct']:>+8.5f}%  "
                  f"{'yes' if row['explained'] else 'NO'}: {row['why']}", flush=True)
    if not done:
        print("no row ran")
        return 1
    big = [r["ratio"] for r in done if r["ranks"] >= 2048]
    top = [r["ratio"] for r in done if r["ranks"] == 8192]
    print(f"ranks={max(r['ranks'] for r in done)} speed_ratio_min={min(big):.0f} " if big else
          f"ranks={max(r['ranks'] for r in done)} speed_ratio_min=nan ", end="")
    print(f"speed_ratio_8192={min(top):.0f} " if top else "speed_ratio_8192=nan ", end="")
    print(f"max_diff={max(abs(r['diff_pct']) for r in done):.5f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
