"""A reduce-copy kernel (c = a + b) on a fixed number of persistent blocks, as NCCL's reduction kernels run one
block per channel: the `kernel` stand-in of validate.collect.gpu_overlap. Imports Triton at import time; imported
only on a GPU machine that has it."""

from __future__ import annotations

import triton
import triton.language as tl

ELEMENTS_PER_STEP = 4096  # per block and loop step: 512 threads x 8 float32


@triton.jit
def _reduce_copy_kernel(a, b, c, n, STEP: tl.constexpr, CTAS: tl.constexpr):
    start = tl.program_id(0) * STEP
    for base in range(start, n, CTAS * STEP):
        offs = base + tl.arange(0, STEP)
        mask = offs < n
        tl.store(c + offs, tl.load(a + offs, mask=mask) + tl.load(b + offs, mask=mask), mask=mask)


def reduce_copy(a, b, c, ctas: int) -> None:
    """Queue c = a + b (float32 CUDA tensors of one size) on the current stream, on `ctas` blocks of 16 warps."""
    _reduce_copy_kernel[(ctas,)](a, b, c, a.numel(), STEP=ELEMENTS_PER_STEP, CTAS=ctas, num_warps=16)
