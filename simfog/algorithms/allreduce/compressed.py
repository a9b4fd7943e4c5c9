"""Compressed gradient allreduce: BAGUA ByteGrad and QAdam (8-bit MinMaxUInt8), DDP's fp16 hook, PowerSGD.

Each is allreduce-SGD (simfog.algorithms.allreduce.program: buckets from comm.merge, launched in order, overlapping
backward) whose bucket costs the compressed bytes on the wire plus the codec's compute: codec bytes /
`comm.encode_bandwidth`, charged to the collective (it runs on the communication side and the collective is
synchronous, so the slowest codec rank's compute-time factor scales it). Horovod's run-time fusion (merge =
"horovod") is not combined with compression.

Sources: BaguaSys/bagua bagua/torch_api/algorithms/bytegrad.py, q_adam.py and
rust/bagua-core/.../comm_ops/centralized_low_precision_synchronous.rs; torch 2.13
torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py (fp16_compress_hook) and powerSGD_hook.py.
"""

from __future__ import annotations

import math

from simfog import merge
from simfog.algorithms.allreduce.plan import bucket_ready, merge_settings, tensor_ready_offsets
from simfog.algorithms.allreduce.program import AllreduceSGD
from simfog.algorithms.codecs import codec_bandwidth, minmax_uint8_bytes
from simfog.engine.protocol import TrainingAlgorithm
from simfog.errors import ConfigError
from simfog.trace import DTYPE_BYTES, Tensor

POWERSGD_MIN_COMPRESSION_RATE = 2  # PowerSGDState(min_compression_rate=2)


def powersgd_sizes(elements: int, rank: int, *, vector: bool = False) -> tuple[int, int, bool]:
    """(P elements, Q elements, compressed?) of one tensor under PowerSGD of `rank`, viewed as the most square
    matrix rows = ⌈√e⌉, cols = ⌈e/rows⌉ (a trace records no shapes); `vector` tensors (1-D: biases) stay whole.
    torch powerSGD_hook._should_compress: compress when (rows + cols)·r·min_compression_rate < rows·cols, with
    r = min(rows, cols, rank)."""
    if vector or elements < 1:
        return 0, 0, False
    rows = math.isqrt(elements - 1) + 1
    cols = -(-elements // rows)
    r = min(rows, cols, rank)
    if (rows + cols) * r * POWERSGD_MIN_COMPRESSION_RATE < rows * cols:
        return rows * r, cols * r, True
    return 0, 0, False


class _Compressed(AllreduceSGD):
    """Allreduce-SGD whose bucket cost is `_cost(tensors) -> dict` (wire_bytes, comm_s, codec_s)."""

    symmetric = True
    codec = "fp16"

    @classmethod
    def for_experiment(cls, experiment) -> type[TrainingAlgorithm]:
        return cls  # Horovod's run-time fusion is not combined with compression: __init__ refuses it

    def __init__(self, sim):
        TrainingAlgorithm.__init__(self, sim)  # its own plan: none of AllreduceSGD's costs beyond the wire
        comm = sim.experiment.comm
        name = comm.algorithm
        if comm.merge in merge.DYNAMIC:
            raise ConfigError("comm.merge", comm.merge, f'a static merge policy for algorithm "{name}" '
                              f"(one of {', '.join(p for p in merge.POLICIES.names() if p not in merge.DYNAMIC)})")
        self.bw = codec_bandwidth(comm, self.codec)
        self.by_name = sim.experiment.workload.trace.tensors
        self.slow = float(max(sim.slowdown[self._codec_ranks()]))
        tensors, offsets = tensor_ready_offsets(sim)
        self.buckets = merge.plan(comm.merge, tensors, merge_settings(comm), self._time_of_bytes)
        self.ready = bucket_ready(self.buckets, tensors, offsets)
        self.costs = [self._bucket([self.by_name[n] for n in b.tensors]) for b in self.buckets]
        self.durations = [c["allreduce_s"] for c in self.costs]
        self._start_collectives()
        if comm.streams != 1:  # bandwidth sharing between concurrent compressed collectives is not modelled
            raise ConfigError("comm.streams", comm.streams, f'1 for algorithm "{name}" (several streams are '
                              'modelled for algorithm = "allreduce" only)')
        self.streams, self.channel = 1, None

    def _bucket(self, tensors) -> dict:
        """wire_bytes, comm_s, codec_s (scaled by the slowest codec rank) and their sum allreduce_s (0 alone)."""
        cost = self._cost(tensors)
        cost["codec_s"] *= self.slow
        cost["allreduce_s"] = cost["comm_s"] + cost["codec_s"] if self.sim.ranks > 1 else 0.0
        return cost

    def _time_of_bytes(self, nbytes: float) -> float:
        """Seconds for a bucket known only by its size, as float32 (for merge policies that plan with costs)."""
        return self._bucket([Tensor("bucket", max(1, int(nbytes) // 4))])["allreduce_s"]

    def _codec_ranks(self):
        """The ranks that run the codec."""
        return slice(None)

    def _cost(self, tensors) -> dict:
        raise NotImplementedError

    def describe_buckets(self) -> list[dict]:
        return [{"bucket": i, "tensors": len(b.tensors), "bytes": b.nbytes, **c}
                for i, (b, c) in enumerate(zip(self.buckets, self.costs, strict=True))]

    def wire_durations(self) -> tuple[list[float], list[float] | None]:
        """The communication varies per call (simfog.variation); the codec's compute does not."""
        if self.sim.ranks == 1:
            return self.durations, None
        return [c["comm_s"] for c in self.costs], [c["codec_s"] for c in self.costs]


class Fp16Allreduce(_Compressed):
    """DDP fp16_compress_hook: gradients cast to float16 for the allreduce (half the bytes) and back."""

    codec = "fp16"

    def _cost(self, tensors) -> dict:
        nbytes = sum(t.nbytes for t in tensors)
        wire = sum(min(t.nbytes, 2 * t.elements) for t in tensors)
        # One cast down before and one cast back after the allreduce: two passes over the bucket.
        return {"wire_bytes": wire, "comm_s": self.sim.cost.allreduce(wire), "codec_s": 2 * nbytes / self.bw}


class ByteGrad(_Compressed):
    """BAGUA ByteGrad: 8-bit MinMaxUInt8 gradients, compressed alltoall then allgather (hierarchical by default)."""

    codec = "minmax_uint8"

    def _codec_ranks(self):
        cluster = self.sim.experiment.cluster
        hier = self.sim.experiment.comm.hierarchical is not False and cluster.ranks_per_node > 1
        return slice(None, None, cluster.ranks_per_node if hier else 1)  # the leaders

    def _cost(self, tensors) -> dict:
        sim, cluster = self.sim, self.sim.experiment.cluster
        nbytes = sum(t.nbytes for t in tensors)
        elements = sum(t.elements for t in tensors)
        hier = sim.experiment.comm.hierarchical is not False and cluster.ranks_per_node > 1
        # Hierarchical: node reduce to local rank 0 (costed as the node allreduce: a ring reduce moves the same
        # bytes), the leaders' compressed exchange, node broadcast. Else every rank is a leader.
        leaders = [u * cluster.ranks_per_node for u in range(cluster.nodes)] if hier else None
        units = cluster.nodes if hier else sim.ranks
        node = range(cluster.ranks_per_node)
        intra = sim.cost.time("allreduce", nbytes, node) + sim.cost.time("broadcast", nbytes, node) if hier else 0.0
        wire = minmax_uint8_bytes(elements, units)  # one chunk per leader
        # The alltoall is costed as an allgather of the same buffer: each rank sends and receives (n-1)/n of it.
        inter = 2 * sim.cost.time("allgather", wire, leaders)
        # Compress all chunks, decompress the received ones, compress the own reduced chunk, decompress all.
        codec_bytes = (3 + 1 / units) * nbytes
        return {"wire_bytes": wire, "comm_s": intra + inter, "codec_s": codec_bytes / self.bw}


class QAdam(ByteGrad):
    """BAGUA QAdam after its warm-up: the momentum, MinMaxUInt8-compressed, exchanged as ByteGrad does."""

    # q_adam.py: after warmup_steps (full-precision gradient allreduce) each bucket gets
    # append_centralized_synchronous_op(hierarchical, average=True, scattergather=True, compression="MinMaxUInt8")
    # on the momentum, the same size as the gradients; the momentum update in the hook is not timed here.


class PowerSGD(_Compressed):
    """DDP PowerSGD hook (steady state): rank-r factors P and Q allreduced, 1-D tensors allreduced whole."""

    codec = "powersgd"

    def _cost(self, tensors) -> dict:
        rank = self.sim.experiment.comm.powersgd_rank or 1
        whole = p = q = compressed = 0
        for t in tensors:
            pe, qe, ok = powersgd_sizes(t.elements, rank, vector=t.name.endswith("bias"))
            if ok:
                size = DTYPE_BYTES[t.dtype]
                p, q, compressed = p + pe * size, q + qe * size, compressed + t.nbytes
            else:
                whole += t.nbytes
        ar = self.sim.cost.allreduce
        # powerSGD_hook: the allreduce of the uncompressed tensors, then of all Ps, then of all Qs, one after the
        # other (each is issued even when empty). Codec: error feedback add, P = MQ, Q = MᵀP, M = PQᵀ, new error:
        # five passes over the compressed tensors. Compression starts at start_powerSGD_iter (1000 in torch):
        # this is the steady state after it.
        return {"wire_bytes": whole + p + q, "comm_s": ar(whole) + ar(p) + ar(q), "codec_s": 5 * compressed / self.bw}
