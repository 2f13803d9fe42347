"""A fake of PopDist, the Poplar SDK library an application uses to learn its place among poprun's
instances. Only the functions the Graphcore plugin and graphcore/examples call are here
(``vision/cnns/pytorch/utils/distributed.py``: isPopdistEnvSet, getNumTotalReplicas,
getNumLocalReplicas, getInstanceIndex, getNumInstances; getNumIpusPerReplica;
``vision/cnns/tensorflow2``: init, ``popdist.tensorflow.set_ipu_config``; graphcore/tensorflow's
``poprun_basic_test.py``: getDeviceId, getReplicaIndexOffset).

The real library reads variables poprun exports; the fake reads ``environment``, which tests set
(None: not launched by poprun). Outside poprun the real ``getNumInstances`` answers 1: IPU Keras
divides every device's IPUs by it, poprun or not (graphcore/keras, r2.6/sdk-release-3.3,
``keras/ipu/extensions/extensions_base.py``, ``_get_num_ipus``).
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


#: times ``init()`` was called (PopDistStrategy calls it in its constructor)
initialised = 0


def init() -> None:
    global initialised
    initialised += 1


def getNumInstances() -> int:
    return 1 if environment is None else _get("instances")


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


#: multi-IPU device ids the fake hands out, and the IPUs each spans
_DEVICES: dict[int, int] = {}


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """The id of the multi-IPU device poprun reserved for the whole run: every instance's replicas
    (IPU Keras's ``_get_num_ipus``: the device's IPUs are "for all instances combined")."""
    per_replica = ipusPerReplica or getNumIpusPerReplica()
    ipus = getNumTotalReplicas() * per_replica
    device_id = 1000 + ipus  # any id; a real one indexes the IPU-POD's device list
    _DEVICES[device_id] = ipus
    return device_id


def ipus_of_device(device_id: int) -> int:
    """IPUs of a device ``getDeviceId`` returned (the fake IPU TensorFlow asks, as Poplar knows)."""
    return _DEVICES[device_id]
