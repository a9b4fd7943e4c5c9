"""Sweep points on a Dask distributed cluster (the `dist` extra): `simfog sweep --scheduler tcp://host:port`.

Each point is one task running `simfog.sweeps.run_point`; rows are yielded as tasks finish (not in submission
order), so `simfog.sweeps.run` appends each row the moment it exists and an interrupted sweep loses only the
points in flight. Workers need simfog installed (same version) and the trace is shipped with the experiment, so
they need no shared file system.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from simfog.errors import ConfigError, SimfogError


def _client(scheduler_address: str, timeout_s: float):
    """(client, as_completed) of dask distributed, connected to the scheduler."""
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise SimfogError("sweeping on Dask needs the dist extra (dask distributed): "
                          "pip install -e '.[dist]'") from None
    try:
        return Client(scheduler_address, timeout=timeout_s, set_as_default=False), as_completed
    except (OSError, TimeoutError) as e:
        raise ConfigError("--scheduler", scheduler_address,
                          f"the address of a running Dask scheduler, e.g. tcp://host:8786 ({e})") from None


def execute(exp, points: Sequence, scheduler_address: str, run_point, *, timeout_s: float = 30.0
            ) -> Iterator[dict]:
    """Run `run_point(exp, p)` (simfog.sweeps.run_point, passed in: this module does not import the sweep) for
    every point on the Dask cluster at `scheduler_address`; yield each row as its task finishes. Raises SimfogError
    when dask distributed is not installed, ConfigError when the scheduler cannot be reached within `timeout_s`
    seconds. Tasks still running when the caller stops iterating are cancelled."""
    points = list(points)
    if not points:
        return
    client, as_completed = _client(scheduler_address, timeout_s)
    futures = []
    try:
        # Scatter once: the experiment (trace included) travels to each worker once, not once per point.
        exp_future = client.scatter(exp, broadcast=True, hash=False)
        futures = [client.submit(run_point, exp_future, p, pure=False) for p in points]
        for future in as_completed(futures, loop=client.loop):
            yield future.result()
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)
        client.close()
