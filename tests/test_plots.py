"""Specification of the journal plots (wf_magic.plots): one bar per attempt, tokens per key."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from wf_magic.display import STATUS_COLOURS
from wf_magic.errors import UsageError
from wf_magic.plots import GATE_HATCH, STATUS_COLORS, timeline, token_chart
from wf_magic.run import Run
from wf_magic.store import Store
from wf_magic.store.db import DB_FILENAME, connect
from wf_magic.store.migrations import apply_migrations

T0 = 1_700_000_000.0


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    connection = connect(tmp_path / DB_FILENAME)
    apply_migrations(connection)
    for run_id in ("r-1", "r-2"):
        connection.execute(
            "INSERT INTO runs (run_id, workflow, plan_json, plan_hash, plan_version, source_hash,"
            " params_json, params_hash, status, scope_key, root_run_id, created_at, updated_at)"
            " VALUES (?, 'demo', ?, 'p', 1, 's', '{}', 'h', 'active', 'demo{}', ?, ?, ?)",
            (run_id, json.dumps({"budget": {}}), run_id, T0, T0),
        )
    return connection


@pytest.fixture
def store(conn: sqlite3.Connection, tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / DB_FILENAME)  # reads the rows the tests write through `conn`
    yield opened
    opened.close()


def add_attempt(
    conn: sqlite3.Connection,
    unit_id: str,
    *,
    run_id: str = "r-1",
    attempt: int = 1,
    phase: str = "work",
    status: str = "succeeded",
    tokens: tuple[int, int] = (10, 5),
    started: float = T0,
    finished: float | None = T0 + 2,
) -> str:
    dispatch_id = f"{run_id}/{unit_id}/{attempt}"
    conn.execute(
        "INSERT INTO attempts (run_id, workflow, step_id, unit_id, attempt, dispatch_id, phase,"
        " loop, runner, model, status, input_hash, charged, tokens_in, tokens_out, started_at,"
        " finished_at)"
        " VALUES (?, 'demo', ?, ?, ?, ?, ?, 1, 'scripted', 'm', ?, 'h', ?, ?, ?, ?, ?)",
        (run_id, unit_id.split("[")[0].split(".")[0], unit_id, attempt, dispatch_id, phase,
         status, int(phase == "work" and status != "reused"), *tokens, started, finished),
    )  # fmt: skip
    return dispatch_id


def seed(conn: sqlite3.Connection) -> list[str]:
    return [
        add_attempt(conn, "draft[0]", status="failed", finished=T0 + 1),
        add_attempt(conn, "draft[0]", attempt=2, started=T0 + 1, finished=T0 + 3),
        add_attempt(conn, "draft[1]", status="reused", tokens=(0, 0), finished=T0),
        add_attempt(conn, "draft.gate:l1", phase="gate", started=T0 + 3, finished=T0 + 4),
        add_attempt(conn, "review", status="running", started=T0 + 4, finished=None),
        add_attempt(conn, "other[0]", run_id="r-2"),
    ][:-1]


def only_bars(figure: Figure) -> list[Rectangle]:
    (ax,) = figure.axes
    (container,) = ax.containers
    assert isinstance(container, BarContainer)
    return list(container.patches)


def test_timeline_draws_exactly_one_bar_per_attempt_of_the_run(
    conn: sqlite3.Connection, store: Store
) -> None:
    dispatch_ids = seed(conn)

    bars = only_bars(timeline(Run(store, "r-1")))

    assert len(bars) == 5
    assert all(isinstance(bar, Rectangle) for bar in bars)
    assert [bar.get_gid() for bar in bars] == dispatch_ids


def test_timeline_colours_bars_by_status_and_hatches_gate_attempts(
    conn: sqlite3.Connection, store: Store
) -> None:
    seed(conn)

    bars = only_bars(timeline(Run(store, "r-1")))

    colours = [to_hex(bar.get_facecolor()) for bar in bars]
    assert colours == [
        STATUS_COLORS[status]
        for status in ("failed", "succeeded", "reused", "succeeded", "running")
    ]
    assert [bar.get_hatch() for bar in bars] == [None, None, None, GATE_HATCH, None]


def test_timeline_places_attempts_in_time_and_retries_on_their_units_row(
    conn: sqlite3.Connection, store: Store
) -> None:
    seed(conn)

    bars = only_bars(timeline(Run(store, "r-1")))

    assert [bar.get_x() for bar in bars] == [0, 1, 0, 3, 4]
    assert [bar.get_width() for bar in bars[:2]] == [1, 2]
    assert bars[2].get_width() > 0  # an instant reused attempt stays visible
    assert bars[4].get_width() == pytest.approx(0.016)  # running: no later news, minimum width
    rows = [bar.get_y() + bar.get_height() / 2 for bar in bars]
    assert rows == [0, 0, 1, 2, 3]


def test_timeline_of_a_run_without_attempts_has_no_bars(store: Store) -> None:
    assert only_bars(timeline(Run(store, "r-empty"))) == []


def test_timeline_renders_to_png_without_pyplot(conn: sqlite3.Connection, store: Store) -> None:
    seed(conn)
    buffer = io.BytesIO()

    timeline(Run(store, "r-1")).savefig(buffer, format="png")

    assert buffer.getvalue().startswith(b"\x89PNG")


def test_token_chart_stacks_paid_judge_and_reused_per_step(
    conn: sqlite3.Connection, store: Store
) -> None:
    seed(conn)
    frame = Run(store, "r-1").tokens(by="step")

    figure = token_chart(Run(store, "r-1"), by="step")

    (ax,) = figure.axes
    paid, judge, reused = ax.containers
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["draft", "review"]
    assert [bar.get_height() for bar in paid] == frame["tokens_paid"].tolist()
    assert [bar.get_height() for bar in judge] == frame["tokens_judge"].tolist()
    assert [bar.get_height() for bar in reused] == frame["tokens_reused"].tolist()
    assert [bar.get_y() for bar in judge] == frame["tokens_paid"].tolist()
    assert (frame["tokens_paid"] + frame["tokens_judge"]).tolist() == frame["tokens"].tolist()


def test_token_chart_rejects_an_unknown_key(store: Store) -> None:
    with pytest.raises(UsageError):
        token_chart(Run(store, "r-1"), by="colour")


def test_plots_without_matplotlib_say_how_to_install_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail

    with pytest.raises(UsageError, match=r"pip install 'wf_magic\[plots\]'"):
        timeline(Run(store, "r-1"))


def test_timeline_of_a_large_fan_out_labels_steps_instead_of_units(
    conn: sqlite3.Connection, store: Store
) -> None:
    for item in range(45):
        add_attempt(conn, f"draft[{item}]", started=T0 + item)
    add_attempt(conn, "review", started=T0 + 50)

    figure = timeline(Run(store, "r-1"))

    (ax,) = figure.axes
    assert len(only_bars(figure)) == 46
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["draft", "review"]
    assert list(ax.get_yticks()) == [0, 45]


def test_plots_take_the_runs_frames_as_well_as_the_run(
    conn: sqlite3.Connection, store: Store
) -> None:
    dispatch_ids = seed(conn)
    run = Run(store, "r-1")

    bars = only_bars(timeline(run.journal()))
    (ax,) = token_chart(run.tokens(by="model"), by="model").axes

    assert [bar.get_gid() for bar in bars] == dispatch_ids
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["m"]
    assert [bar.get_height() for bar in ax.containers[0]] == run.tokens(by="model")[
        "tokens_paid"
    ].tolist()


def test_token_chart_of_a_frame_without_the_key_is_a_usage_error(store: Store) -> None:
    with pytest.raises(UsageError, match=r"grouped by 'model'"):
        token_chart(Run(store, "r-1").tokens(by="step"), by="model")


def test_plot_colours_are_the_display_colour_table() -> None:
    assert STATUS_COLORS == {status: STATUS_COLOURS[status] for status in STATUS_COLORS}
    assert set(STATUS_COLORS) == {"running", "succeeded", "failed", "reused"}


# -- issue 13 item 9: plots that display without %matplotlib inline ---------------------------
def test_run_plots_are_figures_that_a_notebook_shows_as_png_without_pyplot(
    conn: sqlite3.Connection, store: Store
) -> None:
    from IPython.core.formatters import DisplayFormatter

    seed(conn)
    run = Run(store, "r-1")

    for figure in (run.timeline(), run.token_chart(by="step")):
        assert isinstance(figure, Figure)
        data, _meta = DisplayFormatter().format(figure)
        assert set(data) == {"text/plain", "image/png"}
        assert data["image/png"][:4] == b"\x89PNG"  # IPython base64-encodes it on the wire


def test_legends_sit_outside_the_data(conn: sqlite3.Connection, store: Store) -> None:
    seed(conn)
    run = Run(store, "r-1")

    for figure in (run.timeline(), run.token_chart()):
        (ax,) = figure.axes
        legend = ax.get_legend()
        figure.canvas.draw()
        box = legend.get_window_extent()
        assert box.x0 >= ax.get_window_extent().x1  # right of the axes, over no bar


def test_an_instant_judge_verdict_gets_a_visible_bar(
    conn: sqlite3.Connection, store: Store
) -> None:
    add_attempt(conn, "draft", started=T0, finished=T0 + 100)
    add_attempt(conn, "draft.gate:l1", phase="gate", started=T0 + 100, finished=T0 + 100)

    work, gate = only_bars(timeline(Run(store, "r-1")))

    assert gate.get_hatch() == GATE_HATCH
    assert gate.get_width() >= 0.015 * 100  # 1.5 % of the span at least, not a hairline
    assert work.get_width() == 100
