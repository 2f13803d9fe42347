"""The plugin contract: the hooks, the plugin manager, and the bases plugins build on.

Plugin authors import these names from :mod:`core.plugin`, the stable surface, not from here.
"""
