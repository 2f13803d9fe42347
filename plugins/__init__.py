"""Built-in vendor plugins. Each registers through the ``core`` entry-point group, as a third party's would."""
