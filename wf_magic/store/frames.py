"""Typed pandas DataFrames over the state database: runs, journal, tokens, events and budget."""

from __future__ import annotations

import json
import sqlite3
from typing import Literal

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..hashing import canonical_json
from .journal_reads import budget_use
from .runs import RUN_TOTALS, masked

_Kind = Literal["str", "int", "float", "time", "bool"]
_Spec = tuple[tuple[str, str, _Kind], ...]  # (frame column, SQL expression, kind)

_JOURNAL: _Spec = (
    ("run", "run_id", "str"),
    ("step", "step_id", "str"),
    ("unit", "unit_id", "str"),
    ("attempt", "attempt", "int"),
    ("dispatch_id", "dispatch_id", "str"),
    ("phase", "phase", "str"),
    ("runner", "runner", "str"),
    ("model", "model", "str"),
    ("status", "status", "str"),
    ("input_hash", "input_hash", "str"),
    ("tokens_in", "tokens_in", "int"),
    ("tokens_out", "tokens_out", "int"),
    ("cost", "cost", "float"),
    ("reused_from", "reused_from", "str"),
    ("started_at", "started_at", "time"),
    ("finished_at", "finished_at", "time"),
    ("failure", "failure", "str"),
    ("loop", "loop", "int"),
    ("charged", "charged", "bool"),
    ("saved_tokens", "saved_tokens", "int"),
    ("session_id", "session_id", "str"),
    (
        "reused_from_run",
        "(SELECT src.run_id FROM attempts AS src WHERE src.dispatch_id = attempts.reused_from)",
        "str",
    ),
    (
        "reused_from_unit",
        "(SELECT src.unit_id FROM attempts AS src WHERE src.dispatch_id = attempts.reused_from)",
        "str",
    ),
    (
        "verdict",
        "CASE WHEN phase = 'gate' AND status IN ('succeeded', 'reused') AND json_valid(output_json)"
        " THEN CASE json_type(output_json, '$.complete') WHEN 'true' THEN 'passed'"
        " WHEN 'false' THEN 'rejected' END END",
        "str",
    ),
)
JOURNAL_COLUMNS: tuple[str, ...] = (
    "run", "step", "unit", "attempt", "dispatch_id", "phase", "runner", "model", "status",
    "input_hash", "tokens_in", "tokens_out", "cost", "reused_from", "started_at", "finished_at",
    "duration_s", "failure", "loop", "charged", "saved_tokens", "session_id",
    "reused_from_run", "reused_from_unit", "verdict",
)  # fmt: skip
"""The columns of :func:`journal_frame`, in order."""
JOURNAL_COMPACT: tuple[str, ...] = (
    "step", "unit", "attempt", "loop", "phase", "status", "runner", "model", "tokens_in",
    "tokens_out", "duration_s", "started_at", "session_id", "reused_from_run",
    "reused_from_unit", "failure",
)  # fmt: skip
"""The columns ``wf journal`` prints as a table by default (``--all``: every column)."""

_RUNS: _Spec = (
    ("run", "run_id", "str"),
    ("workflow", "workflow", "str"),
    ("status", "status", "str"),
    ("status_reason", "status_reason", "str"),
    ("parent_run", "parent_run_id", "str"),
    ("root_run", "root_run_id", "str"),
    ("forked_from", "forked_from", "str"),
    ("fork_step", "fork_step", "str"),
    ("scope_key", "scope_key", "str"),
    ("params", "params_json", "str"),
    ("plan_hash", "plan_hash", "str"),
    ("plan_version", "plan_version", "int"),
    ("source_path", "source_path", "str"),
    ("use_cache", "use_cache", "bool"),
    ("created_at", "created_at", "time"),
    ("updated_at", "updated_at", "time"),
    ("finished_at", "finished_at", "time"),
    ("owner", "owner", "str"),
)
_EVENTS: _Spec = (
    ("event_id", "event_id", "int"),
    ("run", "run_id", "str"),
    ("at", "at", "time"),
    ("kind", "kind", "str"),
    ("step", "step_id", "str"),
    ("unit", "unit_id", "str"),
    ("dispatch_id", "dispatch_id", "str"),
    ("data_json", "data_json", "str"),
)
_TOKENS_KEYS: dict[str, tuple[str, _Kind]] = {
    "step": ("step_id", "str"),
    "model": ("model", "str"),
    "runner": ("runner", "str"),
    "loop": ("loop", "int"),
    "run": ("run_id", "str"),
    "phase": ("phase", "str"),
}
TOKENS_KEYS: tuple[str, ...] = tuple(_TOKENS_KEYS)
"""The keys :func:`tokens_frame` can group by (e.g. for a CLI's ``--by`` choices)."""
_TOKENS_SUMS: _Spec = (
    ("attempts", "COUNT(*)", "int"),
    ("tokens_in", "SUM(tokens_in)", "int"),
    ("tokens_out", "SUM(tokens_out)", "int"),
    ("tokens", "SUM(tokens_in + tokens_out)", "int"),
    ("cost", "SUM(cost)", "float"),
    ("saved_tokens", "SUM(saved_tokens)", "int"),
    ("tokens_paid", "SUM(CASE WHEN charged <> 0 THEN tokens_in + tokens_out ELSE 0 END)", "int"),
    ("tokens_reused", "SUM(CASE WHEN status = 'reused' THEN saved_tokens ELSE 0 END)", "int"),
    (
        "tokens_judge",
        "SUM(CASE WHEN phase IN ('gate', 'score') AND charged = 0"
        " THEN tokens_in + tokens_out ELSE 0 END)",
        "int",
    ),
)
# The run and every run below it: children point at their root and at their parent.
_TREE_CTE = (
    "WITH RECURSIVE tree(run_id) AS ("
    " SELECT run_id FROM runs WHERE run_id = :run OR root_run_id = :run"
    " UNION SELECT runs.run_id FROM runs JOIN tree ON runs.parent_run_id = tree.run_id) "
)
LLM_SCORE = (
    "a.phase = 'score' AND a.runner NOT IN ('equals', 'contains', 'regex', 'json_schema', 'python')"
)
"""An llm scorer's attempt (a judge); the other scorers journal their own name as runner."""
CEILINGS: tuple[str, ...] = ("units", "tokens", "cost")
"""The budget ceilings, in the row order of :func:`budget_frame`."""


def runs_frame(conn: sqlite3.Connection, *, include_deleted: bool = False) -> pd.DataFrame:
    """One row per run, oldest first.

    Args:
        conn: An open connection to the state database.
        include_deleted: also one row per run gc deleted (from its receipt), and the columns
            ``units``, ``dispatched``, ``tokens_in``, ``tokens_out``, ``cost``,
            ``saved_tokens`` (a run's journal totals, frozen in the receipt at gc) and
            ``deleted_at`` (NaT for a live run).

    Returns:
        A DataFrame with these columns, in order:

        - ``run`` (string): the run id.
        - ``workflow`` (string): the workflow name.
        - ``status`` (string): ``active``, ``blocked``, ``completed``, ``failed`` or ``abandoned``.
        - ``status_reason`` (string): why the run is in that status (e.g. "superseded by r-2").
        - ``parent_run`` (string): the run that invoked this one as a ``workflow:`` step.
        - ``root_run`` (string): the top of the invocation tree (the run itself for a root).
        - ``forked_from`` (string): the run this one was forked from.
        - ``fork_step`` (string): the step the fork re-executes from.
        - ``scope_key`` (string): workflow name + params, the key cells resume by (secret
          params masked as ``***`` here; the stored key is unchanged).
        - ``params`` (string): the run's params after defaults as canonical JSON, secret-looking
          ones (``api_key``, ``db_password``, ...) masked as ``***``: two scopes of one
          workflow differ here.
        - ``plan_hash`` (string): sha256 of the frozen plan JSON.
        - ``plan_version`` (Int64): the plan format version.
        - ``source_path`` (string): the workflow file, when it came from one.
        - ``use_cache`` (boolean): whether results of earlier runs may be reused.
        - ``created_at``, ``updated_at``, ``finished_at`` (datetime64[ns, UTC]).
        - ``owner`` (string): the user the run belongs to; missing for a run from before
          owners were recorded (anyone may change it).
        - ``duration_s`` (float64): ``finished_at - created_at`` in seconds, NaN while unfinished.
    """
    if include_deleted:
        frame = _runs_and_receipts(conn)
    else:
        frame = _query(conn, _RUNS, "FROM runs ORDER BY created_at, run_id", {})
    frame["params"] = _strings(np.array([_masked_json(v) for v in frame["params"]], dtype=object))
    frame["scope_key"] = _strings(
        np.array([_masked_json(v, key="params") for v in frame["scope_key"]], dtype=object)
    )
    frame["duration_s"] = _seconds(frame["finished_at"], frame["created_at"])
    return frame


_TOTAL_KINDS: dict[str, _Kind] = {"cost": "float"}


def _runs_and_receipts(conn: sqlite3.Connection) -> pd.DataFrame:
    """Live runs with their journal totals, and gc receipts with theirs, oldest first."""
    kinds = {name: _TOTAL_KINDS.get(name, "int") for name, _ in RUN_TOTALS}
    live_totals = tuple((name, f"({sql})", kinds[name]) for name, sql in RUN_TOTALS)
    kept_totals = tuple((name, name, kinds[name]) for name, _ in RUN_TOTALS)
    live = _query(conn, (*_RUNS, *live_totals, ("deleted_at", "NULL", "time")), "FROM runs r", {})
    kept = _query(
        conn, (*_RUNS, *kept_totals, ("deleted_at", "deleted_at", "time")), "FROM run_receipts", {}
    )
    both = pd.concat([live, kept], ignore_index=True) if len(kept) and len(live) else None
    frame = both if both is not None else (kept if len(kept) else live)
    return frame.sort_values(["created_at", "run"], kind="stable").reset_index(drop=True)


def _masked_json(text: object, *, key: str | None = None) -> object:
    """JSON ``text`` with secret-looking params masked (under ``key`` when given); else as is."""
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text  # not JSON (a hand-written row): shown as stored
    if key is not None and isinstance(value, dict) and key in value:
        return canonical_json({**value, key: masked(value[key])})
    return canonical_json(masked(value)) if key is None else text


def journal_frame(
    conn: sqlite3.Connection, run_id: str | None = None, *, with_children: bool = False
) -> pd.DataFrame:
    """One row per attempt of the journal, in reservation order.

    Every attempt appears: work, gate and score attempts (``phase``), charged or not, reused
    ones.

    Args:
        conn: An open connection to the state database.
        run_id: Only this run's attempts; all runs when None. An unknown id gives an empty frame.
        with_children: Also the attempts of runs below ``run_id`` (its child workflow runs).

    Returns:
        A DataFrame with the columns of :data:`JOURNAL_COLUMNS`, in order:

        - ``run`` (string): the run id.
        - ``step`` (string): the step id.
        - ``unit`` (string): the unit id; gate verdicts are ``<step>.gate:l<loop>`` (one item's
          of a per-item gate ``<step>.gate:l<loop>[<i>]``), scores ``<step>.score:<name>``
          (one map item's ``<step>.score:<name>[<i>]``).
        - ``attempt`` (Int64): 1 for a unit's first attempt, then 2, 3 … on retries.
        - ``dispatch_id`` (string): the attempt's unique id (a side effect's idempotency key).
        - ``phase`` (string): ``work``, ``gate`` or ``score``.
        - ``runner`` (string): the runner that ran it (e.g. ``openai_chat``, ``scripted``).
        - ``model`` (string): the model asked, <NA> for runners without one.
        - ``status`` (string): ``running``, ``succeeded``, ``failed`` or ``reused``.
        - ``input_hash`` (string): sha256 of the canonical resolved input.
        - ``tokens_in``, ``tokens_out`` (Int64): tokens reported by the runner (0 when reused).
        - ``cost`` (float64): the reported cost, NaN when the runner reports none.
        - ``reused_from`` (string): the source ``dispatch_id`` of a reused attempt.
        - ``started_at``, ``finished_at`` (datetime64[ns, UTC]): NaT while running.
        - ``duration_s`` (float64): seconds from start to finish, NaN while running.
        - ``failure`` (string): the redacted failure message of a failed attempt.
        - ``loop`` (Int64): the gate loop the attempt belongs to, from 1.
        - ``charged`` (boolean): counted in the budget (False for gate and reused attempts).
        - ``saved_tokens`` (Int64): tokens a reused attempt saved, 0 otherwise.
        - ``session_id`` (string): the agent session (or completion) id, <NA> when none.
        - ``reused_from_run``, ``reused_from_unit`` (string): the run and unit whose attempt
          answered a reused one (<NA> otherwise, or when that run was deleted by gc).
        - ``verdict`` (string): a gate attempt's decision, ``passed`` or ``rejected`` (<NA>
          for work attempts and unfinished gate attempts); a per-item gate has one per item.
    """
    cte, where, params = _run_filter(run_id, with_children=with_children)
    frame = _query(conn, _JOURNAL, f"FROM attempts {where} ORDER BY attempt_pk", params, cte=cte)
    frame.insert(16, "duration_s", _seconds(frame["finished_at"], frame["started_at"]))
    return frame


def tokens_frame(
    conn: sqlite3.Connection,
    run_id: str | None = None,
    by: str = "step",
    *,
    with_children: bool = False,
) -> pd.DataFrame:
    """Attempts, tokens and cost grouped by one key, in order of first appearance.

    Nothing is excluded: gate attempts count under their step and reused attempts add their
    (zero) tokens and their saved tokens, exactly as they appear in :func:`journal_frame` — so
    ``tokens`` sums to the journal's ``tokens_in + tokens_out``. Use ``by="phase"`` or filter the
    journal to split gate from work.

    Args:
        conn: An open connection to the state database.
        run_id: Only this run's attempts; all runs when None.
        by: The grouping key: ``step``, ``model``, ``runner``, ``loop``, ``run`` or ``phase``.
        with_children: Also the attempts of runs below ``run_id``.

    Returns:
        A DataFrame with these columns, in order:

        - ``<by>`` (string; Int64 for ``loop``): the key, <NA> for attempts without one (a
          runner with no model).
        - ``attempts`` (Int64): the number of attempts in the group.
        - ``tokens_in``, ``tokens_out`` (Int64): summed reported tokens.
        - ``tokens`` (Int64): ``tokens_in + tokens_out``.
        - ``cost`` (float64): summed reported cost, NaN when no attempt reported one.
        - ``saved_tokens`` (Int64): tokens saved by reused attempts.
        - ``tokens_paid``, ``tokens_reused``, ``tokens_judge`` (Int64): the one token story
          every view tells — paid (charged attempts, what the budget counts), reused (what
          reused answers first cost) and judge (LLM judges and llm scorers outside the budget).

    Raises:
        UsageError: ``by`` is not one of the keys above.
    """
    if by not in _TOKENS_KEYS:
        raise UsageError(f"tokens can be grouped by {', '.join(_TOKENS_KEYS)} (got {by!r})")
    key, kind = _TOKENS_KEYS[by]
    cte, where, params = _run_filter(run_id, with_children=with_children)
    spec: _Spec = ((by, key, kind), *_TOKENS_SUMS)
    tail = f"FROM attempts {where} GROUP BY {key} ORDER BY MIN(attempt_pk)"
    return _query(conn, spec, tail, params, cte=cte)


def events_frame(conn: sqlite3.Connection, run_id: str | None = None) -> pd.DataFrame:
    """One row per event, in the order they were recorded.

    Args:
        conn: An open connection to the state database.
        run_id: Only this run's events; all runs when None.

    Returns:
        A DataFrame with these columns, in order:

        - ``event_id`` (Int64): the event's sequence number.
        - ``run`` (string): the run id.
        - ``at`` (datetime64[ns, UTC]): when it happened.
        - ``kind`` (string): the event kind (e.g. ``unit_started``, ``step_completed``).
        - ``step``, ``unit``, ``dispatch_id`` (string): what it concerns, <NA> when not a unit.
        - ``data_json`` (string): the redacted event payload as JSON.
    """
    _, where, params = _run_filter(run_id, with_children=False)
    return _query(conn, _EVENTS, f"FROM events {where} ORDER BY event_id", params)


def budget_frame(conn: sqlite3.Connection, run_id: str) -> pd.DataFrame:
    """One row per budget ceiling (units, tokens, cost) of a run: used against its limit.

    ``used`` counts only charged attempts (never gate or reused ones) of the run and of every
    run below it, since child workflow runs are charged to their root. For the same reason a
    child run reports its root's budget: the root's ceilings, and what the whole tree used
    (the figures :meth:`wf_magic.Run.budget_use` gives, and the engine enforces).

    Args:
        conn: An open connection to the state database.
        run_id: The run whose budget (from its root's frozen plan) is reported.

    Returns:
        A DataFrame with one row per ceiling in :data:`CEILINGS` order and these columns:

        - ``ceiling`` (string): ``units``, ``tokens`` or ``cost``.
        - ``used`` (float64): charged attempts, their tokens, or their summed cost.
        - ``limit`` (float64): the plan's ``max_units``/``max_tokens``/``max_cost``, NaN if unset.
        - ``remaining`` (float64): ``limit - used`` (negative after an overrun), NaN if unset.
        - ``used_fraction`` (float64): ``used / limit``, NaN if unset.
        - ``saved`` (float64): what reuse saved: reused attempts, their ``saved_tokens``, and
          the cost of their source attempts (those still in the journal).
        - ``judge`` (float64): what LLM judges spent outside the budget (uncharged gate
          attempts, their tokens, their cost).

        On the ``tokens`` row, ``used``, ``saved`` and ``judge`` are the one token story every
        view tells (``paid · reused · judge``, see ``display.TokenSplit``).

    Raises:
        UsageError: no run ``run_id`` is in the state database.
    """
    use = budget_use(conn, run_id)  # the one definition of charged use (the engine's too)
    used = np.array([use.units, use.tokens, use.cost], dtype=np.float64)
    limits = (use.max_units, use.max_tokens, use.max_cost)
    limit = np.array([np.nan if v is None else float(v) for v in limits], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = used / limit
    return pd.DataFrame(
        {
            "ceiling": pd.array(CEILINGS, dtype="string"),
            "used": used,
            "limit": limit,
            "remaining": limit - used,
            "used_fraction": fraction,
            "saved": np.array(_saved_figures(conn, run_id), dtype=np.float64),
            "judge": np.array(_judge_figures(conn, run_id), dtype=np.float64),
        }
    )


def _saved_figures(conn: sqlite3.Connection, run_id: str) -> tuple[float, ...]:
    """What reuse saved over the run's root tree: reused units, saved tokens, source cost."""
    sql = (
        "SELECT TOTAL(CASE WHEN a.status = 'reused' AND a.phase = 'work' THEN 1 ELSE 0 END),"
        " TOTAL(a.saved_tokens),"
        " TOTAL(CASE WHEN a.status = 'reused' THEN source.cost END)"
        " FROM attempts AS a LEFT JOIN attempts AS source ON source.dispatch_id = a.reused_from"
        " WHERE a.run_id IN (SELECT tree.run_id FROM runs AS tree JOIN runs AS run"
        " ON tree.root_run_id = run.root_run_id WHERE run.run_id = ?)"
    )
    return tuple(conn.execute(sql, (run_id,)).fetchone())


def _judge_figures(conn: sqlite3.Connection, run_id: str) -> tuple[float, ...]:
    """What judges spent outside the budget over the run's root tree: uncharged gate attempts
    and llm score attempts (a reused verdict is reuse, not judging), their tokens, their cost."""
    sql = (
        "SELECT TOTAL(1), TOTAL(a.tokens_in + a.tokens_out), TOTAL(a.cost)"
        f" FROM attempts AS a WHERE (a.phase = 'gate' OR ({LLM_SCORE})) AND a.charged = 0"
        " AND a.status <> 'reused'"
        " AND a.run_id IN (SELECT tree.run_id FROM runs AS tree JOIN runs AS run"
        " ON tree.root_run_id = run.root_run_id WHERE run.run_id = ?)"
    )
    return tuple(conn.execute(sql, (run_id,)).fetchone())


def _run_filter(run_id: str | None, *, with_children: bool) -> tuple[str, str, dict[str, str]]:
    """The (CTE, WHERE clause, parameters) selecting one run, or it and its children."""
    if run_id is None:
        return "", "", {}
    if with_children:
        return _TREE_CTE, "WHERE run_id IN tree", {"run": run_id}
    return "", "WHERE run_id = :run", {"run": run_id}


def _query(
    conn: sqlite3.Connection, spec: _Spec, tail: str, params: dict[str, str], *, cte: str = ""
) -> pd.DataFrame:
    """Run one SELECT of ``spec``'s expressions and convert each column vectorised to its kind."""
    select = ", ".join(expr for _, expr, _ in spec)
    grid = _fetch_grid(conn, f"{cte}SELECT {select} {tail}", params, width=len(spec))
    data = {name: _CONVERT[kind](grid[:, i]) for i, (name, _, kind) in enumerate(spec)}
    return pd.DataFrame(data, copy=False)


def _fetch_grid(
    conn: sqlite3.Connection, sql: str, params: dict[str, str], *, width: int
) -> np.ndarray:
    """All result rows as a 2-D object array; its columns are then converted as strided views.

    One C-level ``numpy.array`` pass over the row tuples is several times faster than
    transposing them with ``zip``; the tuples are freed on return to halve peak memory.
    """
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: sqlite3.Row would cost a Python object per row
    rows = cursor.execute(sql, params).fetchall()
    cursor.close()
    return np.array(rows, dtype=object) if rows else np.empty((0, width), dtype=object)


def _strings(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """TEXT (or NULL) to the pandas ``string`` dtype, NULL as <NA>."""
    return pd.array(values, dtype="string")


def _ints(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """INTEGER to nullable ``Int64``; the mask is built only when a NULL is present."""
    try:
        data = values.astype(np.int64)
    except TypeError:  # a NULL: let pandas build the mask
        return pd.array(values, dtype="Int64")
    return pd.arrays.IntegerArray(data, np.zeros(len(data), dtype=bool))


def _floats(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float64)  # NULL (None) becomes NaN


def _times(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """REAL unix seconds to ``datetime64[ns, UTC]``, NULL as NaT.

    Whole seconds and the fraction are scaled apart: ``seconds * 1e9`` alone would exceed
    float64's 53-bit mantissa and be off by up to ~128 ns.
    """
    seconds = values.astype(np.float64)
    missing = np.isnan(seconds)
    whole = np.floor(np.where(missing, 0.0, seconds))
    fraction_ns = np.round((np.where(missing, 0.0, seconds) - whole) * 1e9).astype(np.int64)
    nanos = whole.astype(np.int64) * 1_000_000_000 + fraction_ns
    nanos[missing] = np.iinfo(np.int64).min  # NaT
    return pd.array(nanos.view("M8[ns]")).tz_localize("UTC")


def _bools(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """0/1 INTEGER (NOT NULL) to the nullable ``boolean`` dtype."""
    data = values.astype(np.int64) != 0
    return pd.arrays.BooleanArray(data, np.zeros(len(data), dtype=bool))


def _seconds(end: pd.Series, start: pd.Series) -> np.ndarray:
    """``end - start`` in float seconds, NaN where either is NaT."""
    seconds: np.ndarray = (
        (end - start).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
    )
    return seconds


_CONVERT = {"str": _strings, "int": _ints, "float": _floats, "time": _times, "bool": _bools}
