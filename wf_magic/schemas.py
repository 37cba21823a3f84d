"""Import jsonschema without the one format checker whose import takes seconds.

wf_magic checks params, step outputs and verdicts against JSON Schemas and never checks
``format`` (it passes no ``FormatChecker``). But ``import jsonschema`` registers every format
checker whose library is installed, and ``rfc3987-syntax`` (installed with Jupyter: the
server's ``jupyter-events`` asks for ``jsonschema[format-nongpl]``) compiles about forty lark
grammars when it is imported. Measured in a JupyterLab environment: ``import jsonschema``
1.5–1.9 s, of which that package 1.4–1.7 s; without it 0.15 s. The first ``%%workflow`` cell
with a typed param paid it.

So, unless something in the process imported it already, the package is hidden while
jsonschema is imported: jsonschema then leaves the ``iri`` / ``iri-reference`` format checks
out (or takes them from ``rfc3987`` when that is installed), which only a ``FormatChecker``
would use. The package is importable again right after, for whoever wants it.
"""

from __future__ import annotations

import sys
import threading

SLOW_FORMAT_PACKAGE = "rfc3987_syntax"
_lock = threading.Lock()


def import_jsonschema() -> None:
    """Make ``import jsonschema`` cheap: call this first, then import it as usual.

    Raises:
        ImportError: jsonschema is not installed (or blocked in ``sys.modules``).
    """
    if "jsonschema" in sys.modules:
        return
    with _lock:
        if "jsonschema" in sys.modules:
            return
        hide = SLOW_FORMAT_PACKAGE not in sys.modules
        if hide:
            sys.modules[SLOW_FORMAT_PACKAGE] = None  # type: ignore[assignment]  # ImportError
        try:
            import jsonschema  # noqa: F401
        finally:
            if hide and sys.modules.get(SLOW_FORMAT_PACKAGE, 0) is None:
                del sys.modules[SLOW_FORMAT_PACKAGE]
