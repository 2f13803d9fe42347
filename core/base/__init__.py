"""The bottom layer: plain types every other layer uses, importing nothing of core above them.

``config`` (``RunConfig``, strict types), ``errors``, ``precision`` (the policies), ``results``
(the result document), ``distributed`` (the process context), ``machine`` (a machine profile),
``peaks`` (peak-table types), ``units``, ``epochs``, ``files`` (output written whole or not at all)
and ``deprecation``. tests/test_layers.py keeps them at the bottom (docs/layout.md#layers).
"""
