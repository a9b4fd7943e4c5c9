"""The nodes a validation runs on and the folder it works in: an emulated (or loopback) cluster, a Slurm
allocation's nodes or a real cluster's hosts (`open_nodes`), the GPUs an nccl run needs (`check_gpus`), the packets
the emulated NICs dropped (`dropped_packets`), and the run's temporary folder (`workspace`).

The temporary folder is tempfile.gettempdir()/"simfog-validate-<pid>-<8 random>". A validator killed with SIGKILL
(the only exit that cannot remove its own) has it removed by its supervisor (validate.cluster.supervisor) and,
should that be killed too, by a later run, which the pid tells whose it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from simfog.cluster import Cluster
from simfog.errors import ConfigError

WORKSPACE_PREFIX = "simfog-validate-"
_WORKSPACE = re.compile(rf"{re.escape(WORKSPACE_PREFIX)}(?P<pid>\d+)-[a-z0-9_]{{8}}")


def open_nodes(shape: Cluster, options):
    """The nodes to run on under `options` (validate.run.Options): an emulated (or loopback) cluster of
    shape.nodes, the job's nodes on emulated switch tiers for a shape on a fabric, or a Slurm allocation's nodes,
    or the node agents of `options.hosts`."""
    from validate.cluster.netemu import open_cluster
    from validate.launch.shared_dir import AgentNodes
    from validate.launch.torchrun import RealNodes

    if options.launcher == "slurm":
        return RealNodes([f"slurm-node{i}" for i in range(shape.nodes)], shape.nic.bandwidth_Bps,
                         "a real cluster through Slurm (srun)")
    if options.hosts is not None:
        if len(options.hosts) != shape.nodes:
            raise ConfigError("--hosts", ",".join(options.hosts), f"{shape.nodes} host names (cluster.nodes), the "
                              "first hosting the rendezvous")
        return AgentNodes(list(options.hosts), shape.nic.bandwidth_Bps, options.workdir, port=options.rdzv_port,
                          secret_file=options.secret_file)
    if shape.fabric is not None:  # switch tiers (validate.cluster.fabric_emu): the job's nodes on them
        from validate.cluster.fabric_emu import open_job

        return open_job(shape)
    # NCCL's GPUs talk over NVLink / PCIe, not through an emulated NIC: one machine's GPUs are one node
    emulate = False if options.backend == "nccl" else options.emulate
    return open_cluster(shape.nodes, shape.nic.bandwidth_Bps, emulate=emulate)


def check_gpus(ranks: int) -> None:
    """Raise ConfigError unless this machine shows torch `ranks` CUDA GPUs (--backend nccl, local launcher)."""
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < ranks:
        raise ConfigError("--backend", "nccl", f"gloo on this machine: nccl needs one CUDA GPU per rank ({ranks}), "
                          f"torch sees {have}")


def dropped_packets(cluster) -> int:
    """Packets the emulated NICs' shapers have dropped so far (both directions, every node)."""
    return sum(n[d]["dropped_packets"] for n in cluster.shaper_stats() for d in ("upload", "download"))


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """The run's temporary folder, removed on leaving the block (success, error, KeyboardInterrupt; SIGTERM too, as
    it raises SystemExit meanwhile; SIGKILL by the supervisor, which this starts before anything else changes the
    host). Folders of validators killed with their supervisors are removed first."""
    from validate.cluster.supervisor import temporary_folder
    from validate.launch.launcher import signals_raise

    remove_dead_workspaces()
    with signals_raise(), temporary_folder(f"{WORKSPACE_PREFIX}{os.getpid()}-") as tmp:
        yield tmp


def remove_dead_workspaces() -> None:
    """Removes temporary folders of validators whose process is gone (or a zombie); those of live runs stay."""
    from validate.cluster.supervisor import process_alive

    root = Path(tempfile.gettempdir())
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = _WORKSPACE.fullmatch(name)
        if m and not process_alive(int(m["pid"])):
            shutil.rmtree(root / name, ignore_errors=True)
