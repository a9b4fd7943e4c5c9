"""simfog: a trace-driven simulator of data-parallel training, with a real-run validator beside it.

The Python API (see simfog.api and docs/guide.md, "The Python API"):

    import simfog
    exp = simfog.load("notebooks/experiments/resnet50-v100-25g.toml")
    r = simfog.simulate(exp)                      # r.summary(): dict; r.intervals(): DataFrame
    df = simfog.sweep(exp, ranks=[8, 64], merge=["ddp", "mgwfbp"])   # DataFrame, typed columns
    simfog.jobs.run(simfog.jobs.load("examples/jobs/two-ddp.toml"))  # several jobs on one shared fabric

Importing simfog is cheap: it never imports torch, and pandas, numpy and SimPy only when a function needs them.
"""

from simfog.api import load, simulate, sweep
from simfog.errors import ConfigError, SimfogError

__version__ = "0.1.0"
__all__ = ["load", "simulate", "sweep", "jobs", "ConfigError", "SimfogError", "__version__"]


def __getattr__(name: str):
    """simfog.jobs on first use (docs/fabrics.md calls it after a bare `import simfog`), so the import stays cheap."""
    if name == "jobs":
        import simfog.jobs

        return simfog.jobs
    raise AttributeError(f"module 'simfog' has no attribute {name!r}")
