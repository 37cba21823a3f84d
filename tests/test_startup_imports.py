"""Start-up: `wf --help` and `wf status RUN` load none of the heavy libraries.

Each command runs in-process in a fresh interpreter, which then reports which of the heavy
modules it imported. Modules, not timings: a timing test is flaky on a shared machine, while
an import that sneaks into the start-up path shows up here every time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wf_magic import Engine

PROVIDER_SDKS = ("pydantic_ai", "llm", "genai_prices", "anthropic", "google.genai", "openai")
"""The model SDKs and the price catalogue: loaded by the runner that uses them, when used."""
NEVER = ("pandas", "IPython", "ipywidgets", "jsonschema", "matplotlib", *PROVIDER_SDKS)
"""Never loaded by `wf --help` or `wf status` (nor by a resume of an offline run)."""
PLAN_MODELS = ("pydantic", "yaml", "wf_magic.spec.plan", "wf_magic.drive.loop")
"""The spec and the drive: `wf status` renders a run from its rows and its plan's JSON."""
HEAVY = (*NEVER, *PLAN_MODELS, "jinja2")

REPORT = """
import json, sys
from wf_magic.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = {heavy!r}
print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
"""


def imported_by(state_dir: Path, *argv: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``wf *argv`` in-process."""
    out = subprocess.run(
        [sys.executable, "-c", REPORT.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "WF_MAGIC_HOME": str(state_dir)},
        check=True,
    )
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.fixture
def single_steps(tmp_path: Path) -> str:
    """A finished run without a map step."""
    with Engine(tmp_path) as engine:
        return engine.run("name: plain\nsteps:\n  - id: a\n    prompt: hi\n").run_id


def test_help_loads_no_heavy_module(tmp_path: Path) -> None:
    assert imported_by(tmp_path, "--help") == []


# `wf status RUN` and `wf list` check that each run's stored plan still decodes (issue 19: a
# plan edited into JSON the plan models reject, its hash recomputed, is named in one warning
# line): the plan models (pydantic) load for that; the freezer, YAML, Jinja and the drive do
# not.
VALIDATED = ["pydantic", "wf_magic.spec.plan"]


def test_status_loads_only_the_plan_models_to_validate_the_stored_plan(
    tmp_path: Path, single_steps: str
) -> None:
    assert imported_by(tmp_path, "status", single_steps) == VALIDATED


def test_status_of_a_map_loads_jinja_only_to_count_its_items(tmp_path: Path) -> None:
    with Engine(tmp_path) as engine:
        run = engine.run("name: m\nsteps:\n  - id: m\n    map: '{{ [1, 2] }}'\n    prompt: x\n")
    assert imported_by(tmp_path, "status", run.run_id) == sorted(["jinja2", *VALIDATED])


def test_list_loads_only_the_plan_models_to_validate_the_stored_plans(
    tmp_path: Path, single_steps: str
) -> None:
    assert imported_by(tmp_path, "list") == VALIDATED


RESUME = """
import json, sys
from wf_magic import Engine
with Engine(sys.argv[1]) as engine:
    print(engine.resume(sys.argv[2]).status)
watched = ("yaml", "wf_magic.spec.freeze", "wf_magic.spec.checks", "wf_magic.display",
           "wf_magic.inspection", "wf_magic.library", *{never!r})
print(json.dumps(sorted(m for m in watched if m in sys.modules)))
"""


def test_a_resume_loads_neither_the_yaml_loader_nor_the_renderings(tmp_path: Path) -> None:
    # A resume drives the stored plan: the freezer (YAML, static checks, the library) and the
    # run views are for loading workflows and showing runs.
    with Engine(tmp_path) as engine:
        run = engine.run("name: r\nsteps:\n  - id: a\n    prompt: hi\n", signal=_stopped())
    assert run.status == "active"
    out = subprocess.run(
        [sys.executable, "-c", RESUME.format(never=NEVER), str(tmp_path), run.run_id],
        capture_output=True,
        text=True,
        check=True,
    )
    status, loaded = out.stdout.strip().splitlines()[-2:]
    assert status == "completed"
    assert json.loads(loaded) == []


def _stopped() -> threading.Event:
    """A stop signal already raised: the run starts and stops before its first unit."""
    signal = threading.Event()
    signal.set()
    return signal


def test_importing_the_package_loads_no_provider_sdk_nor_the_price_catalogue() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, wf_magic; "
            f"print(json.dumps(sorted(m for m in {PROVIDER_SDKS!r} if m in sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


SCHEMA_REPORT = """
import json, sys
from wf_magic import Engine
with Engine(sys.argv[1]) as engine:
    status = engine.run(sys.argv[2]).status
    try:
        engine.load(sys.argv[2].replace("default: 2", "default: -1"))
        problem = None
    except Exception as exc:
        problem = str(exc)
hidden = "rfc3987_syntax" not in sys.modules
import rfc3987_syntax  # importable again for whoever wants it
print(json.dumps([status, "jsonschema" in sys.modules, hidden, problem]))
"""


def test_a_typed_param_loads_jsonschema_without_its_slow_format_checker(tmp_path: Path) -> None:
    """rfc3987-syntax (installed with Jupyter) compiles lark grammars for seconds at import;
    wf_magic never checks ``format``, so jsonschema is imported without it."""
    pytest.importorskip("rfc3987_syntax", reason="the slow format package is not installed")
    source = (
        "name: typed\nparams:\n  n: {type: integer, minimum: 0, default: 2}\n"
        "steps:\n  - id: a\n    prompt: 'n={{ params.n }}'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCHEMA_REPORT, str(tmp_path), source],
        capture_output=True,
        text=True,
        check=True,
    )
    status, loaded, hidden, problem = json.loads(out.stdout.strip().splitlines()[-1])
    assert (status, loaded, hidden) == ("completed", True, True)
    assert "default does not match the param schema: -1 is less than the minimum of 0" in problem
