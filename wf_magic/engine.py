"""The Engine facade: start, drive, resume, approve, reject, abandon, fork, stop, adopt, gc,
frames.

Each verb is a few lines over the layers below it: ``lifecycle`` (start, fork),
``drive`` (driving under the run lock), ``gates.human`` (decisions) and the ``Store``
(every row and frame). The CLI and the magics are thin shells over this class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .bus import EventBus, Observer
from .errors import (
    CONCURRENCY_MAX,
    RunAbandoned,
    RunLockHeld,
    UsageError,
    check_counts,
    check_mapping,
)
from .follow import FollowVerbs
from .frame_verbs import FrameVerbs
from .gc import GcVerbs
from .otel.verbs import OtelVerbs
from .redact import Redactor, secret_strings
from .run import Run, RunRef, run_ref
from .store import Store
from .store.db import DB_FILENAME, default_state
from .store.location import PgLocation, parse_state
from .store.records import AttemptRow, RunRow, StepRow
from .sweeps.verbs import SweepVerbs
from .users import check_owner, current_user

# The verbs that freeze, drive or lock a run import lifecycle, the drive, the spec (the plan
# models, Jinja, YAML) and the run locks when called: `wf status` and the other read-only
# verbs build an Engine and a Run without them.
if TYPE_CHECKING:
    from concurrent.futures import Executor

    from . import lifecycle
    from .spec.workflow import Workflow

_AMBIGUOUS_SHOWN = 8
"""How many matches an ambiguous run id prefix lists."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Adoption:
    """What :meth:`Engine.adopt` did: ``adopted`` is empty when the run was already yours."""

    run_id: str
    owner: str
    """The run's owner now (the adopter)."""
    previous_owner: str | None
    """Whom it belonged to before (None: nobody, a run from before owners were recorded)."""
    adopted: tuple[str, ...]
    """The run ids whose owner changed: the run first, then the runs below it."""


class Engine(FrameVerbs, SweepVerbs, GcVerbs, FollowVerbs, OtelVerbs):
    """Everything wf_magic does, as plain Python; the CLI and the magics are thin shells.

    The sweep verbs (``sweep``, ``sweep_resume``, ``sweep_handle``, ``sweeps``) come from
    :class:`wf_magic.sweeps.verbs.SweepVerbs`, ``gc`` from :class:`wf_magic.gc.GcVerbs`, and
    the event cursors (``events_after``, ``follow_events``) from
    :class:`wf_magic.follow.FollowVerbs`, the frames (``journal``, ``calls``, ``tokens``,
    ``budget``, ``compare``, …) from :class:`wf_magic.frame_verbs.FrameVerbs`.

    Args:
        state_dir: where ``state.db`` and the run locks live (default ``$WF_MAGIC_HOME`` or
            ``./.wf_magic``).
        namespace: where bare ``python:`` targets are looked up (a notebook's namespace).
        library: child workflow sources by name.
        durability: ``normal`` (WAL, synchronous=NORMAL) or ``full`` (synchronous=FULL).
        max_concurrency: a cap on map units in flight (the plan's own cap also applies).
        executor: a ``concurrent.futures.Executor`` that runs units (e.g. a Dask client's).
        otlp_endpoint: live OpenTelemetry export to this OTLP/HTTP endpoint (default
            ``$WF_MAGIC_OTLP_ENDPOINT``; docs/otel.md); ``otlp_headers``, ``otlp_content``:
            its headers and whether prompts and outputs go too.
    """

    def __init__(
        self,
        state_dir: str | Path | PgLocation | None = None,
        *,
        namespace: Mapping[str, Any] | None = None,
        library: Mapping[str, str] | None = None,
        durability: str = "normal",
        max_concurrency: int | None = None,
        executor: Executor | None = None,
        otlp_endpoint: str | None = None,
        otlp_headers: Mapping[str, str] | None = None,
        otlp_content: bool = False,
    ):
        state = parse_state(state_dir) if state_dir is not None else default_state()
        self.location: PgLocation | None = state if isinstance(state, PgLocation) else None
        """The PostgreSQL schema holding the journal (None: the folder's SQLite file)."""
        self.state_dir: Path = state.local_dir if isinstance(state, PgLocation) else state
        """This machine's folder of the state (on PostgreSQL: locks, sidecars, the seal key)."""
        self.db_path = self.state_dir / DB_FILENAME
        self.where = state.where if isinstance(state, PgLocation) else str(self.db_path)
        """The state as messages name it: the SQLite file, or the URL without password."""
        self.lock_dir = self.state_dir / "locks"
        self.namespace = namespace
        self.library: dict[str, str] = dict(library or {})
        self.durability = durability
        self.max_concurrency = max_concurrency
        self.executor = executor
        self.bus = EventBus()
        self.redactor = Redactor.from_environ()
        self._secrets: dict[str, Any] = {}
        """Seal → value of every secret param this engine was handed: kept in memory only, so
        a run started here can be driven here; another process must pass them again."""
        self.store = Store(
            self.location or self.db_path, durability=durability, redactor=self.redactor
        )
        """Named queries over the state database (the only way to its rows)."""
        self.otlp = self._live_export(otlp_endpoint, otlp_headers, otlp_content)

    def close(self) -> None:
        """Close the database connections (a live export gets a few seconds to finish first)."""
        if self.otlp is not None:
            self.otlp.close()
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subscribe(self, observer: Observer) -> Callable[[], None]:
        """Receive engine events in-process; returns an unsubscribe function."""
        return self.bus.subscribe(observer)

    # -- workflows and runs -----------------------------------------------------------------
    def load(self, source: str | Path, *, source_name: str | None = None) -> Workflow:
        """Freeze a workflow source (text or path) with this engine's library and namespace."""
        from .spec.freeze import load_workflow

        wf = load_workflow(
            source,
            library=self.library,
            namespace=self.namespace,
            source_name=source_name,
            aliases_home=self.state_dir,
        )
        self.library.setdefault(wf.name, wf.source)
        return wf

    def get_run(self, run_id: RunRef) -> RunRow:
        """The run row of ``run_id`` (an id or a ``Run`` handle).

        Raises:
            UsageError: no such run (close matches are suggested).
        """
        rid = run_ref(run_id)
        row = self.store.get_run(rid)
        if row is None:
            near = self.store.find_run_prefix(rid)
            hint = f" Did you mean {', '.join(near)}?" if near else " `wf list` shows the runs."
            raise UsageError(f"No run {rid!r} in {self.where}.{hint}", run_id=rid)
        return row

    def resolve_run_id(self, run_id: RunRef) -> str:
        """The full id of ``run_id``: an id, a workflow name (its newest root run), a unique
        prefix of an id, or a ``Run`` handle.

        Raises:
            UsageError: no run matches, or the prefix matches several (they are listed).
        """
        rid = run_ref(run_id)
        if self.store.get_run(rid) is not None:
            return rid
        latest = self.store.latest_of_workflow(rid)
        if latest is not None:
            return latest
        near = self.store.find_run_prefix(rid, limit=_AMBIGUOUS_SHOWN + 1) if rid else []
        if len(near) == 1:
            return near[0]
        if len(near) > 1:
            shown = ", ".join(near[:_AMBIGUOUS_SHOWN])
            more = " and more" if len(near) > _AMBIGUOUS_SHOWN else ""
            raise UsageError(
                f"Run id prefix {rid!r} is ambiguous: it matches {shown}{more}; "
                "give more characters of the id.",
                run_id=rid,
            )
        return self.get_run(rid).run_id

    def start(
        self,
        workflow: Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        new: bool = False,
        no_cache: bool = False,
        params_from_strings: bool = False,
        key: str | None = None,
    ) -> Run:
        """Find or create the run a (re-)run of ``workflow`` should drive (DESIGN.md §4).

        Nothing is dispatched; :meth:`drive` does that. A launch ``key`` makes the start
        idempotent: the first start with it records the run it settles on; a later one with
        the same request (plan hash + params hash) returns that run, even with ``new``.

        Returns:
            A ``Run`` handle with ``created`` (False: an unchanged source found its scope's
            existing run, or the key its run) and ``warnings`` (e.g. which run a changed
            source superseded).

        Raises:
            DefinitionError: the source is invalid.
            UsageError: params are undeclared or invalid; ``key`` launched another request.
            RunLockHeld: the run to supersede is being driven.
        """
        from . import lifecycle
        from .spec.workflow import Workflow

        check_mapping(params, what="params")
        wf = workflow if isinstance(workflow, Workflow) else self.load(workflow)
        started = lifecycle.start(
            self.store,
            self.bus,
            wf,
            params=params,
            new=new,
            no_cache=no_cache,
            params_from_strings=params_from_strings,
            key=key,
        )
        self._know(started.secrets)
        return self._handle(started)

    def preview(
        self,
        workflow: Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        params_from_strings: bool = False,
    ) -> Workflow:
        """The workflow as :meth:`start` with ``params`` would freeze it, writing nothing
        (dry runs): models templated from params rendered, aliases resolved.

        Raises:
            DefinitionError: the source is invalid.
            UsageError: given params are invalid, or render an unusable model.
        """
        from . import lifecycle
        from .spec.workflow import Workflow

        wf = workflow if isinstance(workflow, Workflow) else self.load(workflow)
        return lifecycle.preview(wf, params=params, params_from_strings=params_from_strings)

    def run(
        self,
        source: Workflow | str | Path,
        *,
        params: Mapping[str, Any] | None = None,
        new: bool = False,
        no_cache: bool = False,
        max_steps: int | None = None,
        signal: threading.Event | None = None,
        params_from_strings: bool = False,
        max_retries: int = 0,
        key: str | None = None,
    ) -> Run:
        """Start (or find) the run for ``source`` and drive it; see :meth:`start`, :meth:`drive`."""
        from .spec.workflow import Workflow

        wf = source if isinstance(source, Workflow) else self.load(source)
        started = self.start(
            wf,
            params=params,
            new=new,
            no_cache=no_cache,
            params_from_strings=params_from_strings,
            key=key,
        )
        handle = self.drive(
            started, max_steps=max_steps, signal=signal, max_retries=max_retries, live_source=wf
        )
        handle.warnings[:0] = started.warnings
        handle.created = started.created
        return handle

    # -- driving ----------------------------------------------------------------------------
    def drive(
        self,
        run_id: RunRef,
        *,
        max_steps: int | None = None,
        signal: threading.Event | None = None,
        max_concurrency: int | None = None,
        executor: Executor | None = None,
        live_source: Workflow | None = None,
        max_retries: int = 0,
        params: Mapping[str, Any] | None = None,
        params_from_strings: bool = False,
    ) -> Run:
        """Drive a run until it completes, blocks, fails or is stopped.

        The run lock is taken before the plan is read; the plan hash and params hash are
        verified before anything is dispatched. With ``max_retries`` a run that failed on a
        unit that really ran is re-opened and its failed step retried, up to that many times
        (never after a gate outcome, a budget stop, a stop/abort or a unit that ran nothing).

        A run's secret params are stored only as keyed hashes, so their values come from
        ``params`` (checked against those hashes), from this engine if it started the run,
        or from ``WF_PARAM_<NAME>`` environment variables. Other ``params`` must equal the
        run's own.

        Raises:
            RunLockHeld: another driver holds the run.
            RunNotOwned: the run is another user's (:meth:`adopt` it first).
            PlanIntegrityError: the stored plan or params were edited.
            PlanVersionError: the plan was written by a newer wf_magic.
            UsageError: a secret param is missing or differs from the run's.
        """
        from . import lifecycle
        from .drive.context import DriveOptions
        from .drive.root import drive_locked_run

        check_counts(
            max_steps=(max_steps, 1),
            max_concurrency=(max_concurrency, 1, CONCURRENCY_MAX),
            max_retries=(max_retries, 0),
        )
        check_mapping(params, what="params")
        rid = self.resolve_run_id(run_id)
        row = self.get_run(rid)
        check_owner(rid, row.owner, verb="resume")
        secrets = lifecycle.drive_secrets(
            self.store,
            row,
            given=params,
            known=self._secrets,
            from_strings=params_from_strings,
        )
        self._know(secrets)
        options = DriveOptions(
            max_steps=max_steps,
            signal=signal,
            max_concurrency=max_concurrency or self.max_concurrency,
            executor=executor or self.executor,
            secrets=secrets,
        )
        stats, warnings = drive_locked_run(
            self.store,
            self.bus,
            rid,
            options=options,
            redactor=self.redactor,
            namespace=self.namespace,
            max_retries=max_retries,
            live_source=live_source,
        )
        if self.otlp is not None:  # whatever an earlier drive or a dead collector left unsent
            self.otlp.poke(rid)
        handle = Run(self.store, rid, stats=stats, bus=self.bus)
        handle.warnings.extend(warnings)
        return handle

    resume = drive

    # -- verbs ------------------------------------------------------------------------------
    def handle(self, run_id: RunRef) -> Run:
        """A handle on the run (status, steps, result, decisions, frames).

        The handle reads the run's rows and never decodes its plan, so it works on a run this
        version cannot drive; its ``warnings`` then hold one line saying why.
        """
        from .spec.stored import plan_warning

        handle = Run(self.store, self.resolve_run_id(run_id), bus=self.bus)
        warning = plan_warning(handle.row)
        handle.warnings.extend([warning] if warning else [])
        return handle

    status = handle
    """``wf status RUN`` in Python: the run's handle (``engine.status(r).status`` is its word)."""

    def list_runs(
        self, *, include_children: bool = False, limit: int | None = None, owner: str | None = None
    ) -> list[RunRow]:
        """Runs, newest first; ``owner``: only that user's runs and nobody's."""
        return self.store.list_runs(include_children=include_children, limit=limit, owner=owner)

    def steps(self, run_id: RunRef) -> list[StepRow]:
        """The step rows of a run, in plan order."""
        return self.store.steps_of(run_ref(run_id))

    def attempts(self, run_id: RunRef) -> list[AttemptRow]:
        """The journal of a run, in order."""
        return self.store.attempts_of(run_ref(run_id))

    def abandon(self, run_id: RunRef, *, reason: str = "abandoned by user") -> list[str]:
        """Give up a run and every unfinished run below it (its child workflow runs).

        Each run of the family is taken under its lock first, so nothing is abandoned while
        any of them is driven. An abandoned run with unfinished descendants (abandoned before
        abandoning cascaded) has them abandoned now.

        Returns:
            The run ids abandoned, ``run_id`` first when it was unfinished.

        Raises:
            RunLockHeld: the run, or one of its descendants, is being driven (nothing changed).
            UsageError: the run already completed.
            RunAbandoned: the run and all below it were already abandoned or finished.
            RunNotOwned: the run is another user's (:meth:`adopt` it first).
        """
        import contextlib

        from .store.runs import UNFINISHED

        rid = self.resolve_run_id(run_id)
        check_owner(rid, self.get_run(rid).owner, verb="abandon")
        with contextlib.ExitStack() as held:
            held.enter_context(self.store.run_lock(rid))
            row = self.get_run(rid)
            if row.status == "completed":
                raise UsageError(f"Run {rid} completed; there is nothing to abandon.", run_id=rid)
            below = [c for c in self.store.descendants(rid) if c.status in UNFINISHED]
            if row.status == "abandoned" and not below:
                raise RunAbandoned(rid, reason=row.status_reason, verb="abandon")
            for child in below:
                try:
                    held.enter_context(self.store.run_lock(child.run_id))
                except RunLockHeld as exc:
                    exc.message = f"Run {rid} was not abandoned: its child {exc.message}"
                    raise
            reason = self.store.scrubber.text(rid, reason) or reason  # a person's words
            done = self.store.abandon_tree(rid, reason=reason)
        for each in done:
            why = reason if each == rid else "its parent run was abandoned"
            self.bus.notify("run_status", run_id=each, status="abandoned", reason=why)
        return done

    def fork(
        self,
        run_id: RunRef,
        *,
        from_step: str,
        params: Mapping[str, Any] | None = None,
        params_from_strings: bool = False,
    ) -> Run:
        """A new run with the same frozen plan reusing every result before ``from_step``.

        The fork is created, not driven: pass it to :meth:`drive`. An unfinished source is
        superseded by the fork (one unfinished run per scope).

        ``params``: the values of the source's secret params (as :meth:`drive` takes them),
        checked against their seals *before* the fork is created, so a missing or wrong one
        leaves nothing behind (``wf fork`` passes its ``--param``s). Without, the fork is
        created and :meth:`drive` asks for them.

        Raises:
            UsageError: ``from_step`` is not a step of the run's plan; with ``params``, a
                secret param is missing or differs from the run's.
            RunLockHeld: the unfinished source is being driven.
            RunNotOwned: the source is another user's (:meth:`adopt` it first).
        """
        from . import lifecycle
        from .drive.integrity import verified_plan

        source = self.get_run(self.resolve_run_id(run_id))
        check_owner(source.run_id, source.owner, verb="fork")
        if params is not None:
            self._know(
                lifecycle.drive_secrets(
                    self.store,
                    source,
                    given=params,
                    known=self._secrets,
                    from_strings=params_from_strings,
                )
            )
        plan, stored = verified_plan(self.store, self.bus, source)
        started = lifecycle.fork(self.store, self.bus, source, plan, stored, from_step=from_step)
        return self._handle(started)

    def approve(
        self, run_id: RunRef, step_id: str, *, feedback: str | None = None, loop: int | None = None
    ) -> int:
        """Record a person's approval of a blocked gate; the next drive continues the run.

        Returns:
            The loop the decision was recorded for.

        Raises:
            GateDecisionRefused: the step is not waiting (or not at ``loop``), or was decided.
            RunNotOwned: the run is another user's (:meth:`adopt` it first).
            PlanVersionTooNew, PlanVersionError, PlanIntegrityError: the run's plan cannot be
                driven (as ``drive`` refuses it); nothing is recorded.
        """
        return self.handle(run_id).approve(step_id, feedback=feedback, loop=loop)

    def reject(
        self,
        run_id: RunRef,
        step_id: str,
        *,
        feedback: str,
        missing: tuple[str, ...] | list[str] = (),
        loop: int | None = None,
    ) -> int:
        """Record a person's rejection; the next drive re-executes the step with the feedback.

        Raises:
            GateDecisionRefused: the step is not waiting (or not at ``loop``), or was decided.
            PlanVersionTooNew, PlanVersionError, PlanIntegrityError: the run's plan cannot be
                driven (as ``drive`` refuses it); nothing is recorded.
            UsageError: no feedback was given.
            RunNotOwned: the run is another user's (:meth:`adopt` it first).
        """
        handle = self.handle(run_id)
        return handle.reject(step_id, feedback=feedback, missing=missing, loop=loop)

    def stop(self, run_id: RunRef) -> bool:
        """Ask the run's driver (anywhere) to stop gracefully between units.

        A completed or abandoned run has nothing to stop: nothing is written.

        Returns:
            Whether a stop was requested (False: the run is completed or abandoned).

        Raises:
            RunNotOwned: the run is another user's (:meth:`adopt` it first).
        """
        run = self.get_run(self.resolve_run_id(run_id))
        check_owner(run.run_id, run.owner, verb="stop")
        if run.status in ("completed", "abandoned"):
            return False
        self.store.set_stop_requested(run.root_run_id, True)
        return True

    def adopt(self, run_id: RunRef) -> Adoption:
        """Make another user's run (or nobody's) yours, so you may resume, decide, stop,
        abandon or fork it. The runs below it that were the previous owner's (or nobody's)
        come along; each adoption is journaled as a ``run_adopted`` event naming the adopter
        and the previous owner. Adopting your own run changes nothing.

        The current user is :func:`wf_magic.users.current_user` (``$JUPYTERHUB_USER``, else
        the OS user).

        Raises:
            UsageError: no such run, or someone else adopted it meanwhile (nothing changed).
        """
        row = self.get_run(self.resolve_run_id(run_id))
        user = current_user()
        if row.owner == user:
            return Adoption(run_id=row.run_id, owner=user, previous_owner=user, adopted=())
        adopted = self.store.adopt_run(row.run_id, adopter=user, previous=row.owner)
        if not adopted:
            now = self.get_run(row.run_id).owner
            raise UsageError(
                f"Run {row.run_id} was adopted by {now} meanwhile; nothing was changed.",
                run_id=row.run_id,
            )
        return Adoption(
            run_id=row.run_id, owner=user, previous_owner=row.owner, adopted=tuple(adopted)
        )

    def is_driving(self, run_id: RunRef) -> bool:
        """Whether a driver holds the run now."""

        return self.store.is_driven_now(run_ref(run_id))

    # -- helpers ----------------------------------------------------------------------------
    def _know(self, secrets: Mapping[str, Any]) -> None:
        """Keep secret params handed to this engine; every later write masks their values."""
        self._secrets.update(secrets)
        self.store.scrubber.know(secret_strings(list(secrets.values()), secret=True))

    def _handle(self, started: lifecycle.Started) -> Run:
        handle = Run(self.store, started.run_id, created=started.created, bus=self.bus)
        handle.warnings.extend(started.warnings)
        return handle
