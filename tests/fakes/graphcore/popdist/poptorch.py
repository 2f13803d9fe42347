"""Fake ``popdist.poptorch``: ``Options(ipus_per_replica=...)`` is a ``poptorch.Options`` already set
up for this instance (its local replicas and its place among the processes)."""

from __future__ import annotations

import poptorch as _poptorch

import popdist


class Options(_poptorch.Options):
    def __init__(self, ipus_per_replica: int = 1) -> None:
        super().__init__()
        self._record("popdist.poptorch.Options", ipus_per_replica)
        self.replicationFactor(popdist.getNumLocalReplicas())
        self.Distributed.configureProcessId(popdist.getInstanceIndex(), popdist.getNumInstances())
