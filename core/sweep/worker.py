"""The old name of one run in its own process, now core.running.child: ``python -m core.sweep.worker
REQUEST RESULT`` still runs it, for a Slurm job whose batch script an older core wrote."""

from __future__ import annotations

import sys

from core.running.child import PARTIAL_SUFFIX, main

__all__ = ["PARTIAL_SUFFIX", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
