"""The host that launches the kernels: in eager PyTorch the CPU dispatches every operator (Python, the dispatcher,
autograd, the launch) while the GPU runs what it was given, so a step is as long as the later of the two at every
point. Small layers are host-bound (the GPU waits for the next launch), large ones device-bound (the launches queue).

Each launch is issued after the host has spent, since the previous one, `host.forward_op_s` (an operator's first
kernel in forward, its module's call included), `host.backward_op_s` (an operator's first kernel in backward:
autograd's node), `host.optimizer_op_s` (a foreach call of the optimizer) or `host.launch_s` (each further kernel of
the same operator). The GPU starts a kernel when it is issued and the previous one is done:
start_i = max(issue_i, end_(i-1)), end_i = start_i + kernel_i. A layer's time in a pass is what its launches add to
the GPU's end time, so the layers of a step add up to the step, and a launch is "host-bound" when the GPU waited for
it.

These figures belong to the machine and the software (CPU, Python, PyTorch release), not to the GPU: simfog ships
the ones learned from public measurements (simfog.gpu.fit) and `simfog retarget --host-op` sets one's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

HOST_KEYS = ("host.forward_op_s", "host.backward_op_s", "host.optimizer_op_s", "host.launch_s")


def issue_gaps(launches: Sequence, host: Mapping[str, float]) -> np.ndarray:
    """The host time spent before each launch (simfog.gpu.layers.Launch, in program order), per the module
    docstring."""
    gaps = np.zeros(len(launches))
    previous = None
    for i, x in enumerate(launches):
        same_op = previous is not None and (previous.phase, previous.layer, previous.op) == (x.phase, x.layer, x.op)
        if same_op:
            gaps[i] = host["host.launch_s"]
        elif x.phase == "forward":
            gaps[i] = host["host.forward_op_s"]
        elif x.phase == "backward":
            gaps[i] = host["host.backward_op_s"]
        else:
            gaps[i] = host["host.optimizer_op_s"]
        previous = x
    return gaps


def timeline(kernel_s: np.ndarray, gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(what each launch adds to the step, whether the GPU waited for its issue) for kernels of `kernel_s` issued
    after `gaps` of host time each."""
    issue = np.cumsum(gaps)
    end = np.empty(len(kernel_s))
    waited = np.zeros(len(kernel_s), bool)
    last = 0.0
    for i, (t, k) in enumerate(zip(issue, kernel_s, strict=True)):
        start = max(t, last)
        waited[i] = t > last
        last = start + k
        end[i] = last
    added = np.diff(np.concatenate([[0.0], end]))
    return added, waited
