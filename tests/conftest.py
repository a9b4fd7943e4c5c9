"""Shared test helpers: small synthetic traces and experiments with hand-checkable numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from simfog.cluster import Cluster, Link
from simfog.experiment import Comm, Experiment, Workload
from simfog.trace import Layer, ModelTrace, Provenance, Tensor

NIC, INTRA = Link(10e-6, 1.25e9), Link(1e-6, 1e11)

REPO = Path(__file__).resolve().parents[1]
REF = REPO / "bench" / "data" / "ref"  # third-party reference data, byte for byte (its README.md)


def make_trace(forward, backward, param_elements, *, samples=None, optimizer=0.0, model="toy", batch=8):
    """A trace with one tensor per layer (elements given per layer; 0 = no parameters), gradients ready in
    reverse layer order. `forward`/`backward` are per-layer means; `samples` (list of (fwd, bwd) lists) overrides."""
    layers = []
    for i, (f, b, n) in enumerate(zip(forward, backward, param_elements)):
        fs = tuple(s[0][i] for s in samples) if samples else (float(f),)
        bs = tuple(s[1][i] for s in samples) if samples else (float(b),)
        params = (Tensor(f"l{i}.weight", int(n)),) if n else ()
        layers.append(Layer(f"l{i}", fs, bs, params))
    order = tuple(t.name for layer in reversed(layers) for t in layer.params)
    k = len(layers[0].forward_s)
    return ModelTrace(model, batch, "float32", {"kind": "synthetic"}, {}, Provenance("test", "2026-11-21", "test"),
                      tuple(layers), order, optimizer_s=(optimizer,) * k)


def make_experiment(trace, *, nodes=2, gpus_per_node=2, merge="wfbp", collective="linear", alpha=1e-3,
                    beta=1e-9, iterations=3, compute="mean", seed=0, nic=NIC,
                    intra=INTRA, **comm):
    cluster = Cluster(nodes, gpus_per_node, intra, nic)
    c = Comm(collective=collective, merge=merge, alpha_s=alpha, beta_s_per_B=beta, **comm)
    return Experiment(seed, iterations, Workload(trace, "<memory>", compute), cluster, c)


@pytest.fixture
def ref_dir() -> Path:
    """The reference data (bench/data/ref), shipped with the repository."""
    return REF
