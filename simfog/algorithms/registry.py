"""The registry of training algorithms (comm.algorithm): each family of this package registers its algorithms here
(in its __init__), and simfog.algorithms imports every family, so that looking a name up through the package finds
every algorithm."""

from simfog.registry import Registry

REGISTRY = Registry("algorithm")
