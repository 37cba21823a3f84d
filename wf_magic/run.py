"""The Run handle: status, steps, result, frames and rich display of one run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Union

from .bus import EventBus
from .errors import PlanIntegrityError, PlanVersionTooNew, UsageError
from .exits import status_exit_code
from .store import Store
from .store.records import AttemptRow, BudgetUse, RunRow, RunStatus, StepRow
from .store.summary import RunTally
from .users import check_owner

# The plan models (pydantic) load in `plan`, the one place that parses a plan: `wf status`
# builds a Run and prints it from rows and the plan's JSON alone. The renderings, the gate
# decisions and the inspection load where they are used: a drive or a resume needs none.
if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from .comparison import RunComparison
    from .drive.context import DriveStats
    from .gates.verdict import Verdict
    from .inspection import AttemptRecord, UnitDiff
    from .spec.plan import Plan

RunRef = Union[str, "Run"]
"""A run id, or a ``Run`` handle: every Engine method taking a run accepts both."""


def run_ref(run: RunRef) -> str:
    """The run id of ``run`` (an id string or a ``Run`` handle)."""
    return run if isinstance(run, str) else run.run_id


class FrozenPlan:
    """A run's frozen plan with its hash; attributes are the plan's, display is a plan view."""

    def __init__(self, plan: Plan, *, plan_hash: str):
        self.model = plan
        self.plan_hash = plan_hash

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def __repr__(self) -> str:
        from .display import plan_text

        return plan_text(self.model, plan_hash=self.plan_hash)

    def _repr_html_(self) -> str:
        from .display import plan_html

        return plan_html(self.model, plan_hash=self.plan_hash)


class Run:
    """A handle on one run. Properties read the state database afresh each time."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        stats: DriveStats | None = None,
        created: bool = False,
        bus: EventBus | None = None,
    ):
        self.store = store
        self.bus = bus
        """Where decisions made through this handle are announced (live views listen)."""
        self.run_id = run_id
        self.stats = stats
        self.created = created
        """True when the call that returned this handle created the run."""
        self.warnings: list[str] = []

    # -- state ------------------------------------------------------------------------------
    @property
    def row(self) -> RunRow:
        """The run's database row.

        Raises:
            UsageError: the run no longer exists (deleted by gc).
        """
        row = self.store.get_run(self.run_id)
        if row is None:
            raise UsageError(f"Run {self.run_id} is no longer in {self.store.where}.")
        return row

    @property
    def status(self) -> RunStatus:
        """``active``, ``blocked``, ``completed``, ``failed`` or ``abandoned``."""
        return self.row.status

    @property
    def reason(self) -> str | None:
        """Why the run is blocked, failed or abandoned."""
        return self.row.status_reason

    @property
    def superseded_by(self) -> str | None:
        """The run that took this failed run's place (it keeps its failure), if any."""
        return self.store.superseded_by(self.run_id) if self.row.status == "failed" else None

    @property
    def workflow(self) -> str:
        """The workflow name."""
        return self.row.workflow

    @property
    def result(self) -> Any:
        """A completed run's result: its last completed step's output (else None)."""
        row = self.row
        return json.loads(row.result_json) if row.result_json else None

    @property
    def plan(self) -> FrozenPlan:
        """The frozen plan this run executes (renders as a table + Mermaid graph).

        Raises:
            PlanVersionTooNew: a newer wf_magic froze it.
            PlanIntegrityError: the stored plan does not decode (edited outside wf_magic).
        """
        from pydantic import ValidationError

        from .spec.plan import Plan
        from .spec.stored import version_problem

        row = self.row
        version = version_problem(row)
        if version is not None and version.is_newer:
            raise PlanVersionTooNew(f"Run {row.run_id} was {version.text}.", run_id=row.run_id)
        try:
            plan = Plan.model_validate_json(row.plan_json)
        except ValidationError as exc:
            raise PlanIntegrityError(
                f"Run {row.run_id}: its stored plan does not decode ({exc.error_count()} "
                "problem(s)); it was edited outside wf_magic.",
                run_id=row.run_id,
            ) from None
        return FrozenPlan(plan, plan_hash=row.plan_hash)

    @property
    def params(self) -> dict[str, Any]:
        """The run's params after defaults; a secret one as its seal (``wf-sealed:…``), since
        its value is never stored (README "Secrets")."""
        return dict(json.loads(self.row.params_json))

    @property
    def steps(self) -> list[StepRow]:
        """Step rows in plan order."""
        return self.store.steps_of(self.run_id)

    def attempts(self) -> list[AttemptRow]:
        """The run's journal rows, in order."""
        return self.store.attempts_of(self.run_id)

    def tally(self) -> RunTally:
        """Per-step unit and token counts, gate verdicts and reuse, counted in the database."""
        return self.store.run_tally(self.run_id)

    def output(self, step_id: str) -> Any:
        """The output of a completed step (KeyError when it has none)."""
        for row in self.steps:
            if row.step_id == step_id and row.status == "completed" and row.output_json:
                return json.loads(row.output_json)
        raise KeyError(f"step {step_id!r} of run {self.run_id} has no output")

    @property
    def stopped_by(self) -> str | None:
        """Why the last drive through this handle stopped early, if it did."""
        return self.stats.stopped_by if self.stats else None

    @property
    def exit_code(self) -> int:
        """The CLI exit code of this run's state (0 done/stopped, 1 failed, 3 blocked)."""
        return status_exit_code(self.status)

    def budget_use(self) -> BudgetUse:
        """Charged units/tokens/cost of this run's root against its ceilings."""
        return self.store.budget_use(self.run_id)

    # -- decisions ------------------------------------------------------------------------
    def approve(self, step_id: str, *, feedback: str | None = None, loop: int | None = None) -> int:
        """Record a person's approval of a blocked gate; the next drive continues the run.

        Returns:
            The loop the decision was recorded for.

        Raises:
            GateDecisionRefused: the step is not waiting (or not at ``loop``), or was decided.
            RunNotOwned: the run is another user's (adopt it first).
            PlanVersionTooNew, PlanVersionError, PlanIntegrityError: the run's plan cannot be
                driven (as ``drive`` refuses it); nothing is recorded.
        """
        from .gates.verdict import Verdict

        check_owner(self.run_id, self.row.owner, verb="approve")
        verdict = Verdict(complete=True, feedback=feedback or "", judge="human")
        return self._decide(step_id, verdict, loop=loop)

    def reject(
        self,
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
            RunNotOwned: the run is another user's (adopt it first).
        """
        check_owner(self.run_id, self.row.owner, verb="reject")
        if not feedback or not feedback.strip():
            raise UsageError("a rejection needs feedback: say what to change (--feedback TEXT)")
        from .gates.verdict import Verdict

        verdict = Verdict(complete=False, feedback=feedback, missing=tuple(missing), judge="human")
        return self._decide(step_id, verdict, loop=loop)

    def _decide(self, step_id: str, verdict: Verdict, *, loop: int | None) -> int:
        from .bus import EventBus
        from .drive.integrity import verified_plan
        from .gates.human import record_human_verdict
        from .sealing import sealed_words

        # A decision is followed by a drive: it decodes the plan first, and refuses as the
        # drive would (a newer plan version leaves the row byte-identical) before writing.
        verified_plan(self.store, self.bus or EventBus(), self.row)

        # A secret param's value pasted into the feedback is masked though no process that
        # started the run is at hand: its words are checked against the run's seals.
        texts = " ".join([verdict.feedback, *verdict.missing])
        pasted = sealed_words(texts, self.params, self.store.state_dir)
        self.store.scrubber.know(pasted)

        decided = record_human_verdict(
            self.store, self.run_id, step_id, workflow=self.workflow, verdict=verdict, loop=loop
        )
        if self.bus is not None:
            redactor = self.store.scrubber.redactor(self.run_id)  # as the journal keeps it
            self.bus.notify(
                "gate_verdict",
                run_id=self.run_id,
                step_id=step_id,
                loop=decided,
                complete=verdict.complete,
                feedback=redactor.redact(verdict.feedback),
                missing=redactor.redact_value(list(verdict.missing)),
                judge="human",
            )
        return decided

    # -- frames -----------------------------------------------------------------------------
    def scores(self) -> pd.DataFrame:
        """One row per score of this run: ``run``, ``step``, ``name``, ``item`` (<NA> unless a
        map item's), ``value``, ``explanation``, ``unit``, ``status`` (a failed score has no
        value and its failure as explanation); see docs/evaluations.md, "Scores"."""
        return self.store.scores_frame([self.run_id])

    def calls(self, *, unit: str | None = None) -> pd.DataFrame:
        """One row per model call its agent attempts made through the bridge (``unit``: only
        that unit's); the same frame as ``engine.calls(run)`` and ``wf calls RUN``."""
        return self.store.calls_frame(self.run_id, unit_id=unit)

    def journal(self, *, inputs: bool = False) -> pd.DataFrame:
        """One row per attempt of this run; ``inputs=True`` adds what each was sent.

        The ``input`` column holds the redacted resolved input (rendered prompt with its
        feedback block, argv, bindings, or the judge's input) as JSON text, or <NA> for
        attempts journaled before inputs were recorded.
        """
        frame = self.store.journal_frame(self.run_id)
        if inputs:
            kept = self.store.inputs_of(set(frame["input_hash"].dropna()))
            frame["input"] = frame["input_hash"].map(kept).astype("string")
        return frame

    def attempt(self, unit: str, attempt: int | None = None) -> AttemptRecord:
        """What ``unit``'s attempt (default: its newest) was sent, answered and cost.

        Raises:
            UsageError: the run has no such unit or attempt.
        """
        from .inspection import attempt_record

        return attempt_record(self.store, self.run_id, unit, attempt=attempt)

    def diff(self, unit: str, loop_a: int, loop_b: int) -> UnitDiff:
        """How ``unit``'s input and output changed from ``loop_a`` to ``loop_b``.

        Renders as a unified diff (text) and as coloured HTML in a notebook.

        Raises:
            UsageError: the unit has no attempt in one of the loops.
        """
        from .inspection import UnitDiff, loop_diff

        return UnitDiff(loop_diff(self.store, self.run_id, unit, loop_a, loop_b))

    def compare(self, other: RunRef, *, show_all: bool = False) -> RunComparison:
        """This run (the earlier) beside ``other`` (the later), unit by unit.

        Per unit both outputs loop by loop, whether it is changed, new, removed, reused or
        unchanged, and the token and cost deltas; prints as text, renders as HTML.
        """
        from .comparison import compare_runs

        return compare_runs(self.store, self.run_id, run_ref(other), show_all=show_all)

    def tokens(self, by: str = "step") -> pd.DataFrame:
        """Token accounting of this run grouped ``by``."""
        return self.store.tokens_frame(self.run_id, by=by)

    def events(self) -> pd.DataFrame:
        """This run's events."""
        return self.store.events_frame(self.run_id)

    def budget(self) -> pd.DataFrame:
        """Used vs limit per ceiling."""
        return self.store.budget_frame(self.run_id)

    # -- plots ------------------------------------------------------------------------------
    def timeline(self) -> Figure:
        """A Gantt chart of this run's attempts (see :func:`wf_magic.plots.timeline`).

        The figure shows as an image in a notebook, without ``%matplotlib inline``.

        Raises:
            UsageError: matplotlib is not installed (``pip install 'wf_magic[plots]'``).
        """
        from .plots import timeline

        return timeline(self)

    def token_chart(self, by: str = "step") -> Figure:
        """This run's tokens in and out per ``by`` key (see :func:`wf_magic.plots.token_chart`).

        Raises:
            UsageError: matplotlib is not installed, or ``by`` is not a known key.
        """
        from .plots import token_chart

        return token_chart(self, by=by)

    # -- display ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        from .display import run_text

        try:
            return run_text(self)
        except ValueError as exc:
            unreadable = self._undecodable(exc)
            if unreadable is None:
                raise
            raise unreadable from exc

    def _undecodable(self, exc: ValueError) -> Exception | None:
        """A stored row that does not decode (edited by hand) as the state DB's error; None
        for any other ``ValueError`` (a bug, a Unicode error), which stays itself."""
        from pydantic import ValidationError

        if not isinstance(exc, json.JSONDecodeError | ValidationError):
            return None
        first = " ".join((str(exc).splitlines() or [""])[0].split())
        return self.store.unreadable(
            self.run_id, f"its stored rows do not decode ({type(exc).__name__}: {first})"
        )

    def _repr_html_(self) -> str:
        from .display import run_html

        return run_html(self)
