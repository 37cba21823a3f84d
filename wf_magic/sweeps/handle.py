"""The ``Sweep`` handle: a sweep's status, its one-row-per-cell frame, comparisons, pivots and
its static HTML grid."""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..comparison import compare_runs
from ..display.badges import STATUS_COLOURS
from ..errors import UsageError
from ..store import Store
from ..store.sweeps import SweepCellRow, SweepRow
from . import evaluation
from .accounting import sweep_attempts
from .expand import FRAME_COLUMNS
from .paired import Paired
from .resampling import CONFIDENCE, RESAMPLES, SEED
from .sidebyside import CLIP, SideBySide

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


class Sweep:
    """A handle on one sweep (reads its rows; driving goes through ``Engine.sweep``)."""

    def __init__(self, store: Store, sweep_id: str, *, skipped: Sequence[str] = ()):
        self._store = store
        self.sweep_id = sweep_id
        self.skipped = list(skipped)
        """Cells skipped by the last drive because another process drove their run."""

    def __repr__(self) -> str:
        row = self.row
        return f"<Sweep {self.sweep_id} {row.workflow} {self.status} ({row.cells} cells)>"

    @property
    def row(self) -> SweepRow:
        row = self._store.get_sweep(self.sweep_id)
        if row is None:
            raise UsageError(f"No sweep {self.sweep_id!r}; `wf sweeps` lists them.")
        return row

    @property
    def status(self) -> str:
        """``running``, ``completed``, ``stopped`` or ``failed`` (see ``SweepStatus``), or
        ``deleted``: ``wf gc`` deleted the runs of all its cells (each cell reads
        ``deleted``)."""
        return sweep_status(self.row, self._store.sweep_cell_counts(self.sweep_id))[0]

    @property
    def status_reason(self) -> str | None:
        """Why the sweep stands where it does; it names the cells whose runs gc deleted."""
        return sweep_status(self.row, self._store.sweep_cell_counts(self.sweep_id))[1]

    @property
    def axes(self) -> list[str]:
        return list(json.loads(self.row.definition_json)["grid"])

    @property
    def budget(self) -> dict[str, Any]:
        return dict(json.loads(self.row.budget_json))

    def cells(self) -> list[SweepCellRow]:
        """The cell rows, with what their runs report."""
        return self._store.sweep_cells(self.sweep_id)

    def frame(self) -> pd.DataFrame:
        """One row per cell: the axes, then one column per rows-file field (the cell's row's
        value), ``row``, ``repeat``, ``run_id``, ``status``, ``result``, ``tokens_paid``,
        ``tokens_original``, ``cost_paid``, ``cost_original``, ``duration_s``, then
        ``gate_<step>`` / ``gate_<step>_loops`` per gated step, then ``score.<step>.<name>``
        per score of the plan (the cell's value; a map step's mean over its items; NaN when
        not measured or failed), then the result's top-level fields when it is an object."""
        import pandas as pd

        axes = self.axes
        cells = self.cells()
        records = [_record(cell, axes) for cell in cells]
        row_columns = self._row_columns(records, cells)
        gate_columns = self._gate_columns(records)
        score_columns = self._score_columns(records, cells)
        fixed = {*axes, *row_columns, *FRAME_COLUMNS, *score_columns}
        fields: list[str] = []
        for rec in records:
            for name in rec.pop("_fields"):
                if name not in fields and name not in fixed:
                    fields.append(name)
        columns = [*axes, *row_columns, *FRAME_COLUMNS, *gate_columns, *score_columns, *fields]
        return pd.DataFrame(records, columns=columns)

    def _row_columns(self, records: list[dict[str, Any]], cells: list[SweepCellRow]) -> list[str]:
        """Add each rows-file field of the cell's row to ``records`` (in first-seen order)."""
        rows = json.loads(self.row.definition_json).get("rows") or []
        columns = list(dict.fromkeys(name for row in rows for name in row))
        for rec, cell in zip(records, cells, strict=True):
            index = cell.row_index
            row = rows[index] if index is not None and 0 <= index < len(rows) else {}
            for name in columns:
                rec[name] = row.get(name)
        return columns

    def _score_columns(self, records: list[dict[str, Any]], cells: list[SweepCellRow]) -> list[str]:
        """Add ``score.<step>.<name>`` for each score of the plan to ``records``: the cell's
        run's value, the mean over a map step's items."""
        plan = json.loads(self.row.plan_json)
        steps = plan.get("steps", [])
        columns = [f"score.{s['id']}.{sc['name']}" for s in steps for sc in s.get("score", [])]
        if not columns:
            return []
        from ..store.scoreframes import score_means

        runs = [c.run_id for c in cells if c.run_id is not None]
        means = score_means(self._store.scores_frame(runs)) if runs else None
        for rec, cell in zip(records, cells, strict=True):
            for column in columns:
                value = math.nan
                if means is not None and cell.run_id in means.index and column in means.columns:
                    value = float(means.at[cell.run_id, column])
                rec[column] = value
        return columns

    def _gate_columns(self, records: list[dict[str, Any]]) -> list[str]:
        """Add ``gate_<step>`` (passed / blocked / the step's status) and
        ``gate_<step>_loops`` (loops used) for each gated step to ``records``; a per-item gate
        adds ``gate_<step>_items`` (items judged) and ``gate_<step>_passed_items`` (items its
        verdicts accepted, as the journal's ``<step>.gate:l<n>[<i>]`` rows say)."""
        plan = json.loads(self.row.plan_json)
        gated = [s["id"] for s in plan.get("steps", []) if s.get("gate")]
        outcome = {"completed": "passed", "blocked": "blocked"}
        found = {
            (r.cell_index, r.step_id): r for r in self._store.sweep_cell_steps(self.sweep_id, gated)
        }
        per_item = {s["id"] for s in plan.get("steps", []) if (s.get("gate") or {}).get("per_item")}
        items = {
            (r.cell_index, r.step_id): r
            for r in self._store.sweep_cell_items(self.sweep_id, sorted(per_item))
        }
        columns: list[str] = []
        for step in gated:
            columns += [f"gate_{step}", f"gate_{step}_loops"]
            if step in per_item:
                columns += [f"gate_{step}_items", f"gate_{step}_passed_items"]
        for index, rec in enumerate(records):
            for step in gated:
                row = found.get((index, step))
                rec[f"gate_{step}"] = None if row is None else outcome.get(row.status, row.status)
                rec[f"gate_{step}_loops"] = None if row is None else row.loop
                if step in per_item:
                    judged = items.get((index, step))
                    rec[f"gate_{step}_items"] = 0 if judged is None else judged.items
                    rec[f"gate_{step}_passed_items"] = 0 if judged is None else judged.passed
        return columns

    def totals(self) -> dict[str, float]:
        """What the sweep paid: units, tokens and cost, over all its cells."""
        units, tokens, cost = self._store.sweep_usage(self.sweep_id)
        return {"units": units, "tokens": tokens, "cost": cost}

    def flow(self) -> str:
        """Its calls right now, from the journal: ``in flight 24 · throttled 3 · waiting 0.8 s``.

        ``in flight`` counts the attempts running in its cells (in this process the line adds
        the endpoints' current limit: ``24/32``); ``throttled`` the provider's refusals its
        cells waited for; ``waiting`` how long the latest pause still runs.
        """
        import json
        import time

        from ..drive.limiter import LIMITERS

        running, throttles = self._store.sweep_flow(self.sweep_id)
        now, until = time.time(), 0.0
        for at, data in throttles:
            try:
                wait_s = float(json.loads(data).get("wait_s") or 0.0)
            except (ValueError, AttributeError, TypeError):
                continue
            until = max(until, at + wait_s)
        # The limit is shown once a limiter has one (configured, or cut by a refusal).
        limit = sum(s.limit for s in LIMITERS.states() if s.in_flight and s.limit < 1024)
        flight = f"{running}/{limit}" if limit else str(running)
        waiting = max(0.0, until - now)
        return f"in flight {flight} · throttled {len(throttles)} · waiting {waiting:.1f} s"

    def pivot(self, values: str, index: str, columns: str, aggfunc: str = "mean") -> pd.DataFrame:
        """``values`` by ``index`` × ``columns`` (e.g. score by model × style), aggregated."""
        return self.frame().pivot_table(
            values=values, index=index, columns=columns, aggfunc=aggfunc
        )

    def compare(self, other: Sweep, *, on: Sequence[str] | None = None) -> pd.DataFrame:
        """Cells of ``other`` beside this sweep's, matched ``on`` axes (default: the shared
        axes, the row and the repeat): the rows whose result changed, with token and cost
        deltas and the units that differ (``wf_magic.comparison.compare_runs``)."""
        import pandas as pd

        keys = (
            list(on)
            if on is not None
            else [a for a in self.axes if a in other.axes] + ["row", "repeat"]
        )
        mine, theirs = self.frame(), other.frame()
        for name in keys:
            if name not in mine.columns or name not in theirs.columns:
                raise UsageError(f"sweep compare: {name!r} is not a column of both sweeps")
        mine["_order"] = range(len(mine))
        joined = mine.merge(theirs, on=keys, how="outer", suffixes=("_a", "_b"))
        joined = joined.sort_values("_order", na_position="last", kind="stable")
        out = []
        for rec in joined.to_dict(orient="records"):
            run_a, run_b = rec.get("run_id_a"), rec.get("run_id_b")
            if _missing(run_a) or _missing(run_b):
                changed, units = True, None
            else:
                comparison = compare_runs(self._store, str(run_a), str(run_b))
                units = len(comparison.differing())
                changed = rec["result_a"] != rec["result_b"]
            if not changed:
                continue
            out.append(
                {
                    **{k: rec[k] for k in keys},
                    "run_a": run_a,
                    "run_b": run_b,
                    "result_a": rec.get("result_a"),
                    "result_b": rec.get("result_b"),
                    "units_differing": units,
                    "tokens_delta": int(
                        _num(rec.get("tokens_original_b")) - _num(rec.get("tokens_original_a"))
                    ),
                    "cost_delta": _num(rec.get("cost_original_b"))
                    - _num(rec.get("cost_original_a")),
                }
            )
        columns = [
            *keys,
            "run_a",
            "run_b",
            "result_a",
            "result_b",
            "units_differing",
            "tokens_delta",
            "cost_delta",
        ]
        return pd.DataFrame(out, columns=columns)

    def heatmap(self, value: str, x: str, y: str) -> Figure:
        """A Matplotlib heatmap of ``value`` (its mean) by ``x`` × ``y``; it shows as a PNG
        image in a notebook, with or without ``%matplotlib inline`` or the extension.

        Raises:
            UsageError: matplotlib is not installed.
        """
        from ..plots import figure_class

        table = self.pivot(values=value, index=y, columns=x)
        fig = figure_class()(figsize=(1.2 + 1.1 * len(table.columns), 1.0 + 0.6 * len(table.index)))
        ax = fig.add_subplot()
        image = ax.imshow(table.to_numpy(dtype=float), aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(table.columns)), [str(c) for c in table.columns])
        ax.set_yticks(range(len(table.index)), [str(i) for i in table.index])
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(f"{value} by {x} × {y}")
        fig.colorbar(image, ax=ax)
        return fig

    # -- evaluations (docs/evaluations.md): wf_magic.sweeps.evaluation ----------------------
    def attempts(self) -> pd.DataFrame:
        """Every journal attempt of every cell's runs (child runs too), with ``cell``, the
        axes, ``row``, ``repeat`` and ``role`` (``work``, ``judge``, ``scorer``) in front."""
        return sweep_attempts(self._store, self.cells(), self.axes)

    def summary(
        self,
        by: str | Sequence[str] = (),
        *,
        confidence: float = CONFIDENCE,
        resamples: int = RESAMPLES,
        seed: int = SEED,
    ) -> pd.DataFrame:
        """One row per group of ``by`` and score: ``n``, ``missing``, ``mean``, ``stderr``,
        ``ci_low``, ``ci_high`` (a seeded cluster bootstrap over rows; ``attrs`` names the
        method), then the group's ``tokens_paid``, ``cost_paid``, ``latency_p50``,
        ``latency_p90``."""
        return evaluation.summary(self, by, confidence=confidence, resamples=resamples, seed=seed)

    def paired(
        self,
        a: Mapping[str, object],
        b: Mapping[str, object],
        *,
        score: str,
        confidence: float = CONFIDENCE,
        resamples: int = RESAMPLES,
        seed: int = SEED,
    ) -> Paired:
        """``a``'s cells against ``b``'s on ``score``, paired by row, repeat and the other
        axes: the mean difference, its interval, a permutation p-value, wins/ties/losses and
        the cells left unpaired or missing a value, counted and named."""
        return evaluation.paired(
            self, a, b, score=score, confidence=confidence, resamples=resamples, seed=seed
        )

    def side_by_side(
        self,
        columns: str | Sequence[str] = "model",
        index: str | Sequence[str] | None = None,
        score: str | Sequence[str] | None = None,
        only: str | None = None,
        *,
        clip: int = CLIP,
    ) -> SideBySide:
        """One static HTML table: a row per dataset row (``index``: its fields, default all),
        a column per value of ``columns``, each output clipped and expandable beside its
        scores, tokens, cost and latency; ``only``: ``different`` or ``failed``. It has
        ``.frame()``."""
        return evaluation.side_by_side(
            self, columns=columns, index=index, score=score, only=only, clip=clip
        )

    def tokens(self, by: str = "step") -> pd.DataFrame:
        """Attempts, tokens and cost over all cells by ``step``, ``model``, ``phase``,
        ``runner``, an axis, ``row`` or ``repeat``, each group split by ``role``."""
        return evaluation.tokens(self, by)

    def latency(self, by: str = "step") -> pd.DataFrame:
        """Count, p50, p90, p99 of finished attempts' durations over all cells, by ``by`` and
        ``role``."""
        return evaluation.latency(self, by)

    def _repr_html_(self) -> str:
        return grid_html(self)


def sweep_status(row: SweepRow, counts: Sequence[tuple[str, int]]) -> tuple[str, str | None]:
    """The status and reason a sweep reads as, from its row and its cells counted by status
    (``Store.sweep_cell_counts``): ``deleted`` once gc deleted every cell's run; a reason
    naming how many cells' runs gc deleted when it deleted some."""
    deleted = dict(counts).get("deleted", 0)
    if not deleted:
        return row.status, row.status_reason
    if deleted >= row.cells:
        return "deleted", f"`wf gc` deleted the runs of all {row.cells} cells"
    note = f"`wf gc` deleted the runs of {deleted} of its {row.cells} cells"
    return row.status, f"{row.status_reason}; {note}" if row.status_reason else note


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value: Any) -> float:
    return 0.0 if _missing(value) else float(value)


def _record(cell: SweepCellRow, axes: list[str]) -> dict[str, Any]:
    point = json.loads(cell.point_json)
    result = json.loads(cell.result_json) if cell.result_json is not None else None
    duration = (
        cell.run_finished_at - cell.run_created_at
        if cell.run_finished_at is not None and cell.run_created_at is not None
        else None
    )
    rec: dict[str, Any] = {a: point.get(a) for a in axes}
    rec.update(
        row=cell.row_index,
        repeat=cell.repeat,
        run_id=cell.run_id,
        status=cell.status,
        result=result,
        tokens_paid=cell.tokens_paid,
        tokens_original=cell.tokens_original,
        cost_paid=cell.cost_paid,
        cost_original=cell.cost_original,
        duration_s=duration,
    )
    names = list(result) if isinstance(result, dict) else []
    for name in names:
        if name not in rec:
            rec[name] = result[name]  # type: ignore[index]
    rec["_fields"] = names
    return rec


def grid_html(sweep: Sweep) -> str:
    """A static HTML grid of the sweep: one coloured square per cell (its status), tokens
    paid against the sweep's token ceiling."""
    row = sweep.row
    cells = sweep.cells()
    totals = sweep.totals()
    limit = sweep.budget.get("max_tokens")
    of = f" of {limit}" if limit is not None else ""
    squares = "".join(
        "<span title='{t}' style='display:inline-block;width:12px;height:12px;margin:1px;"
        "background:{c}'></span>".format(
            t=html.escape(
                f"cell {c.cell_index} {c.point_json} row {c.row_index} "
                f"repeat {c.repeat}: {c.status} {c.run_id or ''}"
            ),
            c=STATUS_COLOURS.get(c.status, "#ccc"),
        )
        for c in cells
    )
    status, why = sweep_status(row, tuple(Counter(c.status for c in cells).items()))
    reason = f"<div>{html.escape(why)}</div>" if why else ""
    return (
        f"<div class='wf-sweep'><b>sweep {html.escape(row.sweep_id)}</b> "
        f"{html.escape(row.workflow)} · {html.escape(status)} · {len(cells)} cells · "
        f"tokens {int(totals['tokens'])}{of}{reason}<div>{squares}</div></div>"
    )


def sweeps_frame(store: Store) -> pd.DataFrame:
    """One row per sweep, newest first."""
    import pandas as pd

    columns = [
        "sweep_id",
        "workflow",
        "status",
        "status_reason",
        "cells",
        "budget",
        "created_at",
        "updated_at",
    ]
    return pd.DataFrame(
        [
            {
                "sweep_id": r.sweep_id,
                "workflow": r.workflow,
                "status": status,
                "status_reason": reason,
                "cells": r.cells,
                "budget": r.budget_json,
                "created_at": pd.to_datetime(r.created_at, unit="s"),
                "updated_at": pd.to_datetime(r.updated_at, unit="s"),
            }
            for r in store.list_sweeps()
            for status, reason in [sweep_status(r, store.sweep_cell_counts(r.sweep_id))]
        ],
        columns=columns,
    )
