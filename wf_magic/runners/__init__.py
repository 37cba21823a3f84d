"""Runners: the registry, the protocol and the built-in runners."""
