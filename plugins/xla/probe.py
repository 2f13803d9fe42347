"""``python -m core_plugins.xla.probe``: start torch-xla's runtime, print what it reports, exit.

Run by ``XlaAccelerator.devices()`` in a child process (see devices.py): the last line of stdout
is one JSON object with the device count, the device kind and its memory (null where unreported).
"""

from __future__ import annotations

import json

from .devices import runtime_facts

if __name__ == "__main__":
    import torch_xla

    torch_xla.device()  # the runtime starts with the first device it hands out
    print(json.dumps(runtime_facts()))
