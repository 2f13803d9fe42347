"""Built-in workloads, registered through the same entry point group as third-party plugins."""

from __future__ import annotations

from collections.abc import Callable

from core.contract.hookspecs import hookimpl
from core.contract.workload import Workload
from core.workloads.autoencoder import AcesAutoencoder
from core.workloads.detection import DETECTION_WORKLOADS
from core.workloads.digits import Digits
from core.workloads.fcnn import Fcnn
from core.workloads.language import LANGUAGE_WORKLOADS
from core.workloads.segmentation import SEGMENTATION_WORKLOADS
from core.workloads.vision import VISION_WORKLOADS


@hookimpl
def core_register_workloads(register: Callable[[Workload], None]) -> None:
    register(Fcnn())
    register(Digits())
    for workload in (*VISION_WORKLOADS, *LANGUAGE_WORKLOADS, AcesAutoencoder):
        register(workload())
    for dense in (*SEGMENTATION_WORKLOADS, *DETECTION_WORKLOADS):
        register(dense())
