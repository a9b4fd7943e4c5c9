"""Exporters: an experiment -> another tool's input files (`simfog export KIND EXPERIMENT.toml -o DIR`).

    from simfog.exporters import EXPORTERS
    EXPORTERS.get("chakra")(experiment, "out/")    # Chakra traces + ASTRA-sim's network and system inputs

Every exporter is a function `(experiment, folder, *, force=False, exact=True) -> summary` in EXPORTERS
(`simfog list`); it writes a new folder whole or not at all and says in its summary's notes what the other tool
will not see. `exact` False: the other tool's fields only, without what simfog adds to read its own files back.
"""

from __future__ import annotations

from simfog.exporters.chakra import Export, export_chakra
from simfog.registry import Registry

EXPORTERS: Registry = Registry("exporter")
EXPORTERS.register("chakra")(export_chakra)

__all__ = ["EXPORTERS", "Export", "export_chakra"]
