"""Matplotlib figures shown as PNG images in a notebook, without ``%matplotlib inline``."""

from __future__ import annotations

import io
from typing import Any

FIGURE = ("matplotlib.figure", "Figure")
"""The class the PNG formatter is registered for, by name: matplotlib is imported only when a
figure is displayed (never by loading the extension)."""


def figure_png(figure: Any) -> bytes:
    """``figure`` as PNG bytes (the inline backend's size: 100 dpi, tight bounding box)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def register_figure_png(ipython: Any) -> None:
    """Show every matplotlib Figure a cell evaluates to as ``image/png`` (``heatmap``,
    ``timeline``, ``token_chart``, a comparison's plot), in the notebook and its saved file.

    ``%matplotlib inline`` run later registers its own formatter for the same class, which
    then wins: the image shows once either way.
    """
    formatter = ipython.display_formatter.formatters["image/png"]
    formatter.for_type_by_name(*FIGURE, figure_png)


def unregister_figure_png(ipython: Any) -> None:
    """Remove the formatter :func:`register_figure_png` added (not one the inline backend
    set since)."""
    formatter = ipython.display_formatter.formatters["image/png"]
    try:
        current = formatter.lookup_by_type(".".join(FIGURE))
    except KeyError:
        return
    if current is figure_png:
        formatter.pop(".".join(FIGURE), None)
