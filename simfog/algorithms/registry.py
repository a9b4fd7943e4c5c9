"""The registry of training algorithms (comm.algorithm): each module of this package registers its classes here,
and simfog.algorithms imports them all, so that looking a name up through the package finds every algorithm."""

from simfog.registry import Registry

REGISTRY = Registry("algorithm")
