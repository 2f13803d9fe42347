"""Fake of ``tensorflow.python.ipu.distributed`` (not imported by ``tensorflow.python.ipu`` itself)."""
