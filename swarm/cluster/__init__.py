"""Past one GPU: one owner per device as Ray actors, agents routed by affinity."""

from swarm.cluster.host import OwnerSpec
from swarm.cluster.placement import LeastLoaded, OwnerLoad, Pinned, Placement, Router
from swarm.cluster.swarm import ClusterSwarm

__all__ = ["ClusterSwarm", "LeastLoaded", "OwnerLoad", "OwnerSpec", "Pinned", "Placement", "Router"]
