"""How many widget models the notebook views keep: bounded while live, none once static.

Counted in a real kernel through ipywidgets' own registry (``live_models``: its ``_instances``), sampled from a
thread while a 5 000-unit map and a 2 000-cell sweep drive; and in-process for a run view, its
drill-down and a gate panel. A closed model leaves the kernel and the front end's widget
manager, so a saved notebook's widget state no longer carries it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers_notebook import HUMAN_DRAFT, Kernel, drives_of, engine_at, view_of
from wf_magic import Engine
from wf_magic.notebook.detail import MAP_BUTTONS
from wf_magic.notebook.drives import Drives
from wf_magic.notebook.sweepview import MAX_MODELS
from wf_magic.notebook.teardown import live_models

WIDE = """\
name: wide
runner: scripted
steps:
  - id: items
    map: "{{ range(N) | list }}"
    prompt: "Item {{ item }}"
  - id: wrap
    prompt: "Wrap {{ steps.items.output | length }}"
"""

ONE_STEP = """\
name: cells
params:
  i: {type: integer}
runner: scripted
steps:
  - id: write
    prompt: "cell {{ params.i }}"
"""

VIEW_MODELS_PER_STEP = 55
"""A run view's models per step row (its cells, clocks and drill-down panel), whatever the
step's unit count."""
VIEW_MODELS_BASE = 100
"""A run view's models besides its rows (header, budget, gate and review panels, footer)."""

SAMPLER = """\
import threading, time
from wf_magic.notebook.teardown import live_models
_peak = [live_models()]
_stop = threading.Event()
def _sample():
    while not _stop.is_set():
        _peak[0] = max(_peak[0], live_models())
        time.sleep(0.005)
_sampler = threading.Thread(target=_sample, daemon=True)
_sampler.start()
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(tmp_path_factory.mktemp("kernel"))
    with k.client.setup_kernel(cleanup_kc=True):
        k.run(f"%env WF_MAGIC_HOME={k.workdir / 'home'}\n%load_ext wf_magic")
        yield k


def _peak_during(kernel: Kernel, cell: str) -> tuple[int, int, int]:
    """Models before ``cell``, the most while it ran, and after it (in the kernel)."""
    kernel.run("from wf_magic.notebook.teardown import live_models")
    before = kernel.value("live_models()")
    kernel.run(SAMPLER)
    kernel.run(cell)
    kernel.run("_stop.set(); _sampler.join()")
    peak, after = kernel.value("[_peak[0], live_models()]")
    return before, peak, after


def test_a_5000_unit_map_keeps_a_bounded_number_of_models_and_none_once_static(
    kernel: Kernel,
) -> None:
    kernel.home("map")
    before, peak, after = _peak_during(
        kernel, "%%workflow --new\n" + WIDE.replace("range(N)", "range(5000)")
    )
    # Two step rows: the bound does not grow with the map's 5 000 units.
    assert 0 < peak - before <= 2 * VIEW_MODELS_PER_STEP + VIEW_MODELS_BASE
    assert after == before  # the static run view holds no model


def test_a_2000_cell_sweep_keeps_a_bounded_number_of_models_and_none_once_ended(
    kernel: Kernel,
) -> None:
    kernel.home("sweep")
    cells = ",".join(str(i) for i in range(2000))
    before, peak, after = _peak_during(
        kernel, f"%%sweep --grid i={cells} --max-concurrency 8 --as s\n" + ONE_STEP
    )
    assert kernel.value("[s.status, s.row.cells]") == ["completed", 2000]
    assert 0 < peak - before <= MAX_MODELS
    assert after == before  # the cell's result is the static grid: no model is left


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_at(tmp_path / "state")


@pytest.fixture
def drives(engine: Engine) -> Iterator[Drives]:
    yield from drives_of(engine)


def test_a_drill_down_over_5000_units_holds_at_most_its_buttons_however_often_it_loads(
    engine: Engine,
) -> None:
    run = engine.run(WIDE.replace("range(N)", "range(5000)"))
    before = live_models()
    view = view_of(engine, run.run_id)
    view.flush()
    shown = live_models() - before
    assert shown <= 2 * VIEW_MODELS_PER_STEP + VIEW_MODELS_BASE
    view.rows["items"].toggle.value = True
    for _ in range(5):
        view.rows["items"].detail.load()  # type: ignore[union-attr]
    # The buttons share one layout and one style: one model each, made once.
    assert live_models() - before <= shown + MAP_BUTTONS + 2
    view.close()
    assert live_models() == before


def test_a_blocked_views_models_close_except_its_gate_panel_until_the_run_moves_on(
    engine: Engine, drives: Drives
) -> None:
    from wf_magic.notebook.teardown import is_open

    run = engine.run(HUMAN_DRAFT)
    before = live_models()
    view = view_of(engine, run.run_id, drives)
    view.display_handle = _Handle()
    view.decision_handle = _Handle()
    view.flush()
    view.refresh()
    assert view.is_static and view.is_closed
    assert not is_open(view) and not is_open(view.header) and is_open(view.review)
    panel_models = live_models() - before
    assert 0 < panel_models <= 30
    view.review.feedback.value = "fine"
    view.approve_button.click()  # continues the drive: the view is live again
    assert drives.wait(run.run_id, 10)
    view.flush()
    view.refresh()
    assert engine.status(run.run_id).status == "completed"
    assert view.is_closed and live_models() == before


class _Handle:
    """A display handle that keeps what was published last (no front end here)."""

    def __init__(self) -> None:
        self.shown: object = None

    def update(self, obj: object, **_kw: object) -> None:
        self.shown = obj


def test_a_static_view_shown_again_opens_its_models_again(engine: Engine) -> None:
    from wf_magic.notebook.teardown import is_open

    run = engine.run(WIDE.replace("range(N)", "range(3)"))
    view = view_of(engine, run.run_id)
    view.display_handle = _Handle()
    view.flush()
    view.refresh()
    assert view.is_closed and not is_open(view.rows["items"].toggle)
    bundle = view.live_bundle()  # what `run.view` as a cell's value displays
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == view.model_id
    assert not view.is_closed and is_open(view.rows["items"].toggle)
    assert "Run completed." not in bundle["text/plain"] and run.run_id in bundle["text/plain"]
    view.close()
