__version__ = "7.0.2"
