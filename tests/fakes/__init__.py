"""Faithful fakes of vendor SDKs, importable under their real module names by test fixtures."""
