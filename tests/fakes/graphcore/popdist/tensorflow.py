"""Fake ``popdist.tensorflow``: ``set_ipu_config(config, ipus_per_replica=None, configure_device=True)``.

PopDist's source is not public. What the function does is modelled on the open code that does the
same by hand: graphcore/tensorflow (r2.6/sdk-release-3.3) ``compiler/plugin/poplar/tests/
poprun_basic_test.py`` selects ``config.select_ipus = [popdist.getDeviceId()]`` and writes
``experimental.multi_replica_distribution.process_count`` / ``process_index`` from
``popdist.getNumInstances()`` / ``getInstanceIndex()`` (as ``PopDistStrategy.update_ipu_config``
does); graphcore/examples ``vision/cnns/tensorflow2/ipu_config.py`` calls it with
``ipus_per_replica`` and ``configure_device=True`` before ``configure_ipu_system()``."""

from __future__ import annotations

from typing import Any

import popdist

calls: list[tuple[str, Any]] = []


def set_ipu_config(config: Any, ipus_per_replica: int | None = None, configure_device: bool = True) -> None:
    calls.append(("set_ipu_config", ipus_per_replica, configure_device))
    per_replica = ipus_per_replica or popdist.getNumIpusPerReplica()
    if configure_device:
        config.select_ipus = [popdist.getDeviceId(per_replica)]
    config.experimental.multi_replica_distribution.process_count = popdist.getNumInstances()
    config.experimental.multi_replica_distribution.process_index = popdist.getInstanceIndex()
