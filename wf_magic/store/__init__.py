"""The state database: the Store (connections + named queries), migrations, rows."""

from .store import Store

__all__ = ["Store"]
