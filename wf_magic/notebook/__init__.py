"""The notebook surface: ``%%workflow``/``%workflow`` magics and the live run view widget.

Only this package imports IPython and ipywidgets; ``wf_magic.load_ipython_extension`` imports
it lazily, so the engine stays usable without either.
"""

from __future__ import annotations

from .magics import WorkflowMagics, load_ipython_extension, unload_ipython_extension

__all__ = ["WorkflowMagics", "load_ipython_extension", "unload_ipython_extension"]
