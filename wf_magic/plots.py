"""Matplotlib figures of a run's journal: a timeline of attempts and tokens by a key.

Each plot takes a :class:`wf_magic.Run` handle (anything with ``journal()`` and
``tokens(by=...)``) or the DataFrame such a handle returns, so a filtered frame plots too.
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from .display import STATUS_COLOURS, TokenSplit, token_text
from .errors import UsageError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


class RunFrames(Protocol):
    """What the plots read from a run (a :class:`wf_magic.Run` handle is one)."""

    run_id: str

    def journal(self) -> pd.DataFrame: ...

    def tokens(self, by: str = "step") -> pd.DataFrame: ...


STATUS_COLORS: dict[str, str] = {
    status: STATUS_COLOURS[status] for status in ("succeeded", "failed", "reused", "running")
}
"""The bar colour of each attempt status in :func:`timeline` (display's colour table)."""
GATE_HATCH = "///"
"""The hatch that marks gate (judge) attempts in :func:`timeline`."""
_MAX_UNIT_TICKS = 40
_MIN_WIDTH_FRACTION = 0.004  # of the time span, so instant (reused) attempts stay visible
_MIN_GATE_WIDTH_FRACTION = 0.015  # a judge's verdict is often instant: keep its bar readable


def timeline(run: RunFrames | pd.DataFrame) -> Figure:
    """A Gantt chart of a run's attempts: one horizontal bar per attempt, one row per unit.

    Bars are coloured by status (:data:`STATUS_COLORS`); gate attempts are hatched with
    :data:`GATE_HATCH` and outlined. The x axis is seconds since the run's first attempt
    started. An attempt still running extends to the latest time in the journal; attempts of
    no duration (reused results) get a small minimum width. Each bar's ``gid`` is its
    ``dispatch_id``. All bars are one ``BarContainer`` (``fig.axes[0].containers[0]``).

    Args:
        run: The run to draw (its ``journal()``), or a journal frame to draw as it is.

    Returns:
        A :class:`matplotlib.figure.Figure` (no pyplot, no GUI backend involved) that shows
        as a PNG image in a notebook, with or without ``%matplotlib inline``.

    Raises:
        UsageError: matplotlib is not installed.
    """
    figure_cls = figure_class()
    journal = run if isinstance(run, pd.DataFrame) else run.journal()
    rows, units = pd.factorize(journal["unit"])  # one row per unit, in order of first attempt
    left, width = _bar_extents(journal)
    if len(width):
        span = max(float((left + width).max()), 1.0)
        is_gate = journal["phase"].to_numpy() == "gate"
        width = np.where(is_gate, np.maximum(width, span * _MIN_GATE_WIDTH_FRACTION), width)
    fig = figure_cls(figsize=(10, max(2.5, min(0.25 * len(units) + 1.5, 14))), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh(
        rows,
        width,
        left=left,
        height=0.7,
        color=[STATUS_COLORS.get(status, "#999999") for status in journal["status"]],
    )
    for bar, phase, dispatch_id in zip(
        bars.patches, journal["phase"], journal["dispatch_id"], strict=True
    ):
        bar.set_gid(dispatch_id)
        if phase == "gate":
            bar.set_hatch(GATE_HATCH)
            bar.set_edgecolor("#222222")
            bar.set_linewidth(0.8)
            bar.set_zorder(3)  # above a work bar it touches
    _label_timeline(ax, journal, rows, [str(unit) for unit in units])
    ax.set_title(f"{_subject(run, journal)}{len(journal)} attempts")
    return fig


def token_chart(run: RunFrames | pd.DataFrame, by: str = "step") -> Figure:
    """A stacked bar chart of a run's tokens per key: paid, judge, reused.

    The figures are :func:`~wf_magic.store.frames.tokens_frame`'s ``tokens_paid``,
    ``tokens_judge`` and ``tokens_reused`` — the labelling every view uses (paid: what the
    budget counts; judge: LLM judges outside the budget; reused: what reused answers first
    cost, drawn hatched since nobody paid it now); the title gives the three totals.

    Args:
        run: The run to chart (its ``tokens(by=by)``), or a tokens frame grouped ``by``.
        by: The key: ``step``, ``model``, ``runner``, ``loop``, ``run`` or ``phase``.

    Returns:
        A :class:`matplotlib.figure.Figure` whose three containers hold the paid, judge and
        reused bars, stacked in that order, one stack per key; it shows as a PNG image in a
        notebook, with or without ``%matplotlib inline``.

    Raises:
        UsageError: matplotlib is not installed, ``by`` is not a known key, or a given frame
            has no ``by`` column.
    """
    figure_cls = figure_class()
    tokens = _tokens(run, by)
    labels = [str(key) for key in tokens[by].astype("string").fillna("(none)")]
    paid, judge, reused = (
        tokens[name].to_numpy(dtype=np.int64)
        for name in ("tokens_paid", "tokens_judge", "tokens_reused")
    )
    fig = figure_cls(figsize=(max(4.0, 0.8 * len(labels) + 2), 4), layout="constrained")
    ax = fig.add_subplot()
    positions = np.arange(len(labels))
    ax.bar(positions, paid, label="paid", color="#3b6ea5")
    ax.bar(positions, judge, bottom=paid, label="judge", color="#e0a030")
    ax.bar(
        positions,
        reused,
        bottom=paid + judge,
        label="reused",
        color="#d8dee4",
        hatch="//",
        edgecolor="#8c959f",
    )
    ax.set_xticks(positions, labels, rotation=30 if len(labels) > 6 else 0, ha="right")
    ax.set_xlabel(by)
    ax.set_ylabel("tokens")
    split = TokenSplit(paid=int(paid.sum()), reused=int(reused.sum()), judge=int(judge.sum()))
    ax.set_title(f"{_subject(run, tokens)}tokens by {by}: {token_text(split)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def _tokens(run: RunFrames | pd.DataFrame, by: str) -> pd.DataFrame:
    """The tokens frame grouped ``by``: the run's, or the given frame once it has that key."""
    if not isinstance(run, pd.DataFrame):
        return run.tokens(by=by)
    if by not in run.columns:
        raise UsageError(
            f"token_chart(by={by!r}) expected a tokens frame grouped by {by!r} "
            f"(got columns {', '.join(map(str, run.columns))}); pass `by` as it was grouped."
        )
    return run


def _subject(run: RunFrames | pd.DataFrame, frame: pd.DataFrame) -> str:
    """``Run r-12: `` for a title, when the plot is of one known run (else nothing)."""
    if not isinstance(run, pd.DataFrame):
        return f"Run {run.run_id}: "
    # A frame names its run only in a ``run`` column, and only if it holds just one.
    if "run" not in frame.columns:
        return ""
    runs = frame["run"].dropna().unique()
    return f"Run {runs[0]}: " if len(runs) == 1 else ""


def figure_class() -> type[Figure]:
    """The Figure class every plot of the package builds (``timeline``, ``token_chart``,
    ``Sweep.heatmap``): matplotlib's, imported lazily (an optional extra), with a PNG
    representation of its own, so a figure shows as an image as a cell's last expression
    whether or not ``%matplotlib inline`` ran or the extension is loaded.

    Raises:
        UsageError: matplotlib is not installed.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise UsageError(
            "Plots need matplotlib, which is not installed; install it with "
            "`pip install 'wf_magic[plots]'`."
        ) from exc
    return _displayable(Figure)


@functools.cache
def _displayable(figure_cls: type[Figure]) -> type[Figure]:
    """A Figure class that a notebook shows as a PNG image.

    A Figure built without pyplot has no PNG representation unless ``%matplotlib inline``
    registered one; this one has ``_repr_png_`` of its own (the inline backend's formatter,
    when active, still wins, so the image shows once either way).
    """

    class RunFigure(figure_cls):  # type: ignore[valid-type,misc]  # a class made at run time
        """A matplotlib Figure with a PNG representation for notebooks."""

        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
            return buffer.getvalue()

    RunFigure.__module__ = __name__
    RunFigure.__qualname__ = "RunFigure"
    return RunFigure


def _bar_extents(journal: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each attempt's start and duration in seconds since the run's first attempt started."""
    started, finished = journal["started_at"], journal["finished_at"]
    if journal.empty:
        return np.zeros(0), np.zeros(0)
    origin = started.min()
    latest = pd.concat([started, finished]).max()
    finished = finished.fillna(latest)  # still running: up to the latest news in the journal
    left = (started - origin).dt.total_seconds().to_numpy(dtype=np.float64)
    width = (finished - started).dt.total_seconds().to_numpy(dtype=np.float64)
    span = max((latest - origin).total_seconds(), 1.0)
    return left, np.maximum(width, span * _MIN_WIDTH_FRACTION)


def _label_timeline(ax: Axes, journal: pd.DataFrame, rows: np.ndarray, units: list[str]) -> None:
    """Axis labels, unit ticks (step ticks for a large fan-out) and the status/gate legend."""
    from matplotlib.patches import Patch

    if len(units) <= _MAX_UNIT_TICKS:
        ax.set_yticks(range(len(units)), units)
    else:
        first_rows = pd.Series(rows, index=journal.index).groupby(journal["step"], sort=False).min()
        ax.set_yticks(first_rows.to_numpy(), [str(step) for step in first_rows.index])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first attempt started")
    handles = [Patch(color=color, label=status) for status, color in STATUS_COLORS.items()]
    handles.append(Patch(facecolor="white", edgecolor="#222222", hatch=GATE_HATCH, label="gate"))
    # Outside the axes: a legend inside would hide the bars of the first or last units.
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize="small",
    )
