"""One rank of `simfog collect network` for torch.distributed (gloo on CPU, NCCL on one GPU per rank).

Started by validate.collect.collect_network, never by hand:
    python -m validate.collect.collect_network_worker --plan PLAN.json --out DIR --rank R --world N --backend gloo
        --init tcp://ADDR:PORT
Writes DIR/rank<R>.json (see collect_network.write_rank_result). torch-only module.
"""

from __future__ import annotations

import argparse
import datetime
import json
import warnings

import torch
import torch.distributed as dist

from validate.collect.collect_network import ELEMENT_BYTES, time_plan, write_rank_result
from validate.launch.launcher import end_with_launcher

# torch 2.13 renamed the single-tensor collectives and deprecates the old names; older torch has only those.
_ALLGATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def make_op(collective: str, nbytes: int, rank: int, world: int, device: torch.device):
    """Allocate the float32 buffers for one (collective, size) and return the call to time."""
    n = nbytes // ELEMENT_BYTES
    zeros = lambda k: torch.zeros(k, dtype=torch.float32, device=device)  # zeros: no overflow however often summed
    if collective == "allreduce":
        x = zeros(n)
        return lambda: dist.all_reduce(x)
    if collective == "allgather":
        inp, out = zeros(n // world), zeros(n)
        return lambda: _ALLGATHER(out, inp)
    if collective == "reduce_scatter":
        inp, out = zeros(n), zeros(n // world)
        return lambda: _REDUCE_SCATTER(out, inp)
    if collective == "broadcast":
        x = zeros(n)
        return lambda: dist.broadcast(x, src=0)
    if collective == "sendrecv":
        # Ring shift: every rank sends nbytes to rank+1 and receives nbytes from rank-1, all at once. The receive is
        # posted first, as the neighbour exchange posts it (validate.ranks.decentralized): gloo with the send first
        # ran a 1 MB two-rank exchange at half the rate of either direction (79 vs 40 ms at 200 Mbit/s) and made the
        # slowest rank of a 4-rank ring ~15 % slow; NCCL groups the two, so the order does not matter there.
        send, recv = zeros(n), zeros(n)
        ops = [dist.P2POp(dist.irecv, recv, (rank - 1) % world), dist.P2POp(dist.isend, send, (rank + 1) % world)]
        return lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]
    raise ValueError(f"unknown collective {collective!r}")


def main(argv: list[str] | None = None) -> int:
    end_with_launcher()  # a rank never outlives the process that launched it
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--local-rank", type=int, default=0)
    p.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    p.add_argument("--init", required=True)
    p.add_argument("--timeout", type=int, default=600)
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    plan = json.loads(open(a.plan).read())
    torch.set_num_threads(1)
    device = torch.device("cpu")
    sync = lambda: None
    if a.backend == "nccl":
        device = torch.device("cuda", a.local_rank)
        torch.cuda.set_device(device)
        sync = lambda: torch.cuda.synchronize(device)
    dist.init_process_group(a.backend, init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=a.timeout))
    try:
        samples = time_plan(plan, lambda c, b: make_op(c, b, a.rank, a.world, device), dist.barrier, sync)
    finally:
        dist.destroy_process_group()
    software = {"torch": torch.__version__}
    if a.backend == "nccl":
        software["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        software["gpu"] = torch.cuda.get_device_name(device)
    write_rank_result(a.out, a.rank, samples, {"threads": torch.get_num_threads(), "software": software})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
