"""A fake of PopDist, the Poplar SDK library an application uses to learn its place among poprun's
instances. Only the functions the Graphcore plugin and graphcore/examples call are here
(``vision/cnns/pytorch/utils/distributed.py``: isPopdistEnvSet, getNumTotalReplicas,
getNumLocalReplicas, getInstanceIndex, getNumInstances; getNumIpusPerReplica).

The real library reads variables poprun exports; the fake reads ``environment``, which tests set
(None: not launched by poprun).
"""

from __future__ import annotations

from typing import Optional

#: {"instances", "instance_index", "total_replicas", "ipus_per_replica"}, or None outside poprun
environment: dict | None = None


def isPopdistEnvSet() -> bool:
    return environment is not None


def _get(key: str) -> int:
    if environment is None:
        raise RuntimeError("PopDist environment is not set: the application was not launched by poprun")
    return int(environment[key])


def getNumInstances() -> int:
    return _get("instances")


def getInstanceIndex() -> int:
    return _get("instance_index")


def getNumTotalReplicas() -> int:
    return _get("total_replicas")


def getNumLocalReplicas() -> int:
    return getNumTotalReplicas() // getNumInstances()


def getNumIpusPerReplica() -> int:
    return _get("ipus_per_replica")


def getReplicaIndexOffset() -> int:
    return getInstanceIndex() * getNumLocalReplicas()
