"""Fake of ``tensorflow.python.ipu.ops``: only ``pipelining_ops``."""
