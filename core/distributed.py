"""Where this process stands in a multi-process run (as torchrun describes it in the environment)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def reads_node_meter(self) -> bool:
        """One rank per node reads the node's meters, so energy is never counted twice."""
        return self.local_rank == 0

    @classmethod
    def from_environment(cls) -> "ProcessContext":
        """torchrun sets RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE for each worker."""
        env = os.environ
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
        )


SINGLE_PROCESS = ProcessContext()
