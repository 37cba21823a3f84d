"""Who the current user is, and whether a run's owner lets them change it (DESIGN.md §9).

Every verb that records or checks a run's owner asks :func:`current_user`, so the CLI, the
magics and the Engine agree on one answer: ``$JUPYTERHUB_USER`` when it is set (a JupyterHub
single-user server runs every user's kernel as one OS account, so the OS name would make the
whole team one user), else the OS login name. A run whose owner is ``None`` (written before
owners were recorded) belongs to nobody, so anyone may change it.
"""

from __future__ import annotations

import getpass
import os

from .errors import RunNotOwned

USER_ENV = "JUPYTERHUB_USER"
"""The environment variable naming the current user ahead of the OS account."""


def current_user() -> str:
    """The current user: ``$JUPYTERHUB_USER`` if set and not blank, else the OS login name.

    ``getpass.getuser()`` raises when neither ``$LOGNAME``/``$USER`` nor the password
    database names the process's uid (a container run with an arbitrary ``--user``); the
    uid itself (``uid-1000``) then stands for the user, so a run is still attributed.
    """
    hub = os.environ.get(USER_ENV, "").strip()
    if hub:
        return hub
    try:
        name = getpass.getuser().strip()
    except (OSError, KeyError, ImportError):  # no name for this uid
        name = ""
    if name:
        return name
    getuid = getattr(os, "getuid", None)
    return f"uid-{getuid()}" if getuid is not None else "unknown"


def may_change(owner: str | None, user: str) -> bool:
    """Whether ``user`` may change a run owned by ``owner`` (theirs, or nobody's)."""
    return owner is None or owner == user


def check_owner(run_id: str, owner: str | None, *, verb: str, user: str | None = None) -> None:
    """Refuse ``verb`` on another user's run (an unowned or own run passes).

    Raises:
        RunNotOwned: the run belongs to someone else (CLI exit 2); nothing was changed.
    """
    user = user if user is not None else current_user()
    if not may_change(owner, user):
        raise RunNotOwned(run_id, owner=owner or "", user=user, verb=verb)
