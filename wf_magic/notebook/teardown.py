"""Closing a view's widget models: a widget, its children, layout and style, recursively."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import ipywidgets as w

_OWNED = ("layout", "style")
"""Traits holding a widget model that belongs to its owner alone (closed with it)."""


def tree_of(root: w.Widget, *, keep: Iterable[w.Widget] = ()) -> Iterator[w.Widget]:
    """``root`` and every widget model under it (children, layouts, styles), each once;
    a widget in ``keep`` and everything under it are left out."""
    kept = {id(k) for k in keep}
    seen: set[int] = set()
    stack = [root]
    while stack:
        widget = stack.pop()
        if id(widget) in seen or id(widget) in kept:
            continue
        seen.add(id(widget))
        yield widget
        for name in _OWNED:
            owned = getattr(widget, name, None) if widget.has_trait(name) else None
            if isinstance(owned, w.Widget):
                stack.append(owned)
        children = getattr(widget, "children", ()) if widget.has_trait("children") else ()
        stack.extend(c for c in children if isinstance(c, w.Widget))


def close_tree(root: w.Widget, *, keep: Iterable[w.Widget] = ()) -> int:
    """Close ``root`` and every model under it except ``keep``'s; returns how many were open.

    A closed model leaves the kernel's registry and the front end's widget manager, so
    neither the kernel nor a saved notebook's widget state keeps it.
    """
    closed = 0
    for widget in list(tree_of(root, keep=keep)):
        if widget.comm is not None:
            closed += 1
        w.Widget.close(widget)  # the model alone: a view's own close() stops observing too
    return closed


def reopen_tree(root: w.Widget) -> int:
    """Open again every closed model of ``root``'s tree (the same Python objects, new model
    ids), innermost first so a container's state names open children; returns how many."""
    reopened = 0
    for widget in reversed(list(tree_of(root))):
        if widget.comm is None:
            # close() hid the class's display method behind an instance attribute.
            widget.__dict__.pop("_repr_mimebundle_", None)
            widget._model_id = None  # a fresh id: the front end destroyed the old model
            widget.open()
            reopened += 1
    return reopened


def is_open(widget: w.Widget) -> bool:
    """Whether ``widget``'s model is open (it has a comm to the front end)."""
    return widget.comm is not None


def live_models() -> int:
    """How many widget models this kernel keeps open (ipywidgets' registry: the module's
    ``_instances`` since 8.0, where ``Widget.widgets`` is deprecated; the class's before)."""
    from ipywidgets.widgets import widget as module

    registry = getattr(module, "_instances", None)
    return len(registry if registry is not None else w.Widget.widgets)
