"""One rank of `simfog collect network --backend mpi` (mpi4py on numpy float32 buffers).

Started by validate.collect.collect_network under mpiexec, never by hand:
    mpiexec -n N python -m validate.collect.collect_network_mpi_worker --plan PLAN.json --out DIR
Writes DIR/rank<R>.json (see collect_network.write_rank_result).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from mpi4py import MPI

from validate.collect.collect_network import ELEMENT_BYTES, time_plan, write_rank_result
from validate.launch.launcher import end_with_launcher


def make_op(collective: str, nbytes: int, comm):
    """Allocate the buffers for one (collective, size) and return the call to time."""
    n, rank, world = nbytes // ELEMENT_BYTES, comm.Get_rank(), comm.Get_size()
    zeros = lambda k: np.zeros(k, dtype=np.float32)
    if collective == "allreduce":
        x, y = zeros(n), zeros(n)
        return lambda: comm.Allreduce(x, y, op=MPI.SUM)
    if collective == "allgather":
        inp, out = zeros(n // world), zeros(n)
        return lambda: comm.Allgather(inp, out)
    if collective == "reduce_scatter":
        inp, out = zeros(n), zeros(n // world)
        return lambda: comm.Reduce_scatter_block(inp, out, op=MPI.SUM)
    if collective == "broadcast":
        x = zeros(n)
        return lambda: comm.Bcast(x, root=0)
    if collective == "sendrecv":
        # Ring shift: every rank sends nbytes to rank+1 and receives nbytes from rank-1, all at once.
        send, recv = zeros(n), zeros(n)
        return lambda: comm.Sendrecv(send, dest=(rank + 1) % world, recvbuf=recv, source=(rank - 1) % world)
    raise ValueError(f"unknown collective {collective!r}")


def main(argv: list[str] | None = None) -> int:
    end_with_launcher()  # a rank never outlives the process that launched it
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    plan = json.loads(open(a.plan).read())
    samples = time_plan(plan, lambda c, b: make_op(c, b, comm), comm.Barrier)
    import mpi4py

    software = {"mpi4py": mpi4py.__version__, "numpy": np.__version__,
                "mpi": MPI.Get_library_version().strip().splitlines()[0].split(",")[0]}
    write_rank_result(a.out, comm.Get_rank(), samples, {"threads": 1, "software": software})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
