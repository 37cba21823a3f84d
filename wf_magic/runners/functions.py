"""Python step targets: a name registry, ``module:function`` imports, and source hashes."""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..hashing import sha256_text

_registry: dict[str, Callable[..., Any]] = {}
_lock = threading.Lock()


class TargetError(Exception):
    """A python target cannot be resolved; the message says what to do."""


def register_function(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn`` usable as ``python: <name>`` in workflows of this process."""
    if not callable(fn):
        raise TypeError(f"register_function({name!r}, ...) expects a callable")
    with _lock:
        _registry[name] = fn


def _import(module_name: str, search_dir: str | None) -> Any:
    """Import ``module_name``; failing that, also from ``search_dir`` (the workflow's folder)."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        if not search_dir or search_dir in sys.path:
            raise
    with _lock:  # the folder is on sys.path only for this import
        sys.path.insert(0, search_dir)
        try:
            return importlib.import_module(module_name)
        finally:
            sys.path.remove(search_dir)


def resolve(
    target: str, namespace: Mapping[str, Any] | None = None, *, search_dir: str | None = None
) -> Callable[..., Any]:
    """The callable for ``target``: ``module:function``, a registered name or a namespace name.

    ``module:function`` modules are imported normally, else from ``search_dir`` (the folder
    of the workflow file), so a helper module beside the YAML just works.

    Raises:
        TargetError: nothing by that name, or it is not callable.
    """
    if ":" in target:
        module_name, _, attr = target.partition(":")
        try:
            obj: Any = _import(module_name, search_dir)
        except ImportError as exc:
            raise TargetError(
                f"cannot import module {module_name!r} for python target {target!r}: {exc}"
            ) from exc
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise TargetError(f"module {module_name!r} has no attribute {attr!r}")
    elif target in _registry:
        obj = _registry[target]
    elif namespace is not None and target in namespace:
        obj = namespace[target]
    else:
        raise TargetError(
            f"unknown python target {target!r}: use `module:function`, define it in "
            "the notebook, or register it with wf_magic.register_function"
        )
    if not callable(obj):
        raise TargetError(f"python target {target!r} is not callable")
    return obj  # type: ignore[no-any-return]


def source_hash(fn: Callable[..., Any]) -> str:
    """sha256 of a callable's source (its bytecode and constants when source is unavailable)."""
    try:
        return sha256_text(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return sha256_text(repr(fn))
        return sha256_text(code.co_code.hex() + repr(code.co_consts))


def target_hash(
    target: str, namespace: Mapping[str, Any] | None = None, *, search_dir: str | None = None
) -> str:
    """Resolve ``target`` and hash its source (frozen into the plan)."""
    return source_hash(resolve(target, namespace, search_dir=search_dir))
