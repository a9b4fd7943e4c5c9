"""Shared fabrics: switch topologies, where a job's nodes sit on them, and how a step's flows share their links.

Modules, one concept each:
- base: NICs and their links, routing entry point, checks (`Fabric`); links: link tables, routes, the ECMP hash
- flat (`Flat`, today's default), clos (`FatTree`, two or three tiers), rail (`RailOptimized`), dragonfly
- config: a fabric from the experiment's [fabric] table (`from_table`)
- placement: a job's nodes (`Placement`, `place`)
- flows: a step's flows and their times (`Flows`, `step_times`); sharing: max-min fair rates
- schedules: ring, tree and hierarchical collectives' step patterns and their per-step bottleneck
- job: a job's view of the fabric (`JobFabric`: its placement, other jobs' `Traffic`), `attach` to a cluster, and
  the slowdown a collective's inter-node hops get (`inter_slowdown`)
- cosim: several jobs' timelines replayed together in time, their collectives slowed by the traffic on beside them

Units are SI inside (bytes, seconds, bytes/s); human units only in the [fabric] table.
"""

from simfog.fabric.base import Fabric, nic_of_gpu
from simfog.fabric.clos import FatTree
from simfog.fabric.config import default_fabric, from_table
from simfog.fabric.dragonfly import Dragonfly
from simfog.fabric.flat import Flat
from simfog.fabric.flows import Flows, StepTimes, step_times
from simfog.fabric.job import JobFabric, Slowdown, Traffic, attach, inter_slowdown
from simfog.fabric.links import ECMP, LinkTable, Routes
from simfog.fabric.placement import Placement, place
from simfog.fabric.rail import RailOptimized
from simfog.fabric.schedules import (
    StepCost,
    StepPattern,
    hierarchical_pattern,
    pattern,
    ring_pattern,
    shared_step_costs,
    step_cost,
    tree_pattern,
)
from simfog.fabric.sharing import max_min_rates, slowest_rate

__all__ = ["ECMP", "Dragonfly", "Fabric", "FatTree", "Flat", "Flows", "JobFabric", "LinkTable", "Placement",
           "RailOptimized", "Routes", "Slowdown", "StepCost", "StepPattern", "StepTimes", "Traffic", "attach",
           "default_fabric", "from_table", "hierarchical_pattern", "inter_slowdown", "max_min_rates", "nic_of_gpu",
           "pattern", "place", "ring_pattern", "shared_step_costs", "slowest_rate", "step_cost", "step_times",
           "tree_pattern"]
