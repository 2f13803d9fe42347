"""Running: options into a plan, the timed phases of one process, and the processes around it
(torchrun workers, process groups, time limits)."""
