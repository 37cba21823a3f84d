"""The public surface: what ``import wf_magic`` gives, costs, and how ``python -m wf_magic`` runs."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import wf_magic
from wf_magic.drive import executors
from wf_magic.exits import EXIT_FAILED

HEAVY_MODULES = ("pandas", "IPython", "ipywidgets", "jsonschema", "matplotlib")
FRAME_FUNCTIONS = ("budget", "events", "journal", "runs", "tokens")


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def test_import_wf_magic_imports_no_heavy_module(tmp_path: Path) -> None:
    code = (
        "import json, sys, wf_magic; "
        f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]))"
    )
    done = _python("-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_python_dash_m_wf_magic_help_exits_0(tmp_path: Path) -> None:
    done = _python("-m", "wf_magic", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: wf ")


def test_python_dash_m_wf_magic_exits_with_the_commands_code(tmp_path: Path) -> None:
    source = tmp_path / "boom.yaml"
    source.write_text(
        'name: boom\nsteps:\n  - id: boom\n    exec: [python3, -c, "raise SystemExit(3)"]\n'
    )
    done = _python(
        "-m", "wf_magic", "--db", str(tmp_path / "state"), "run", str(source), cwd=tmp_path
    )
    assert done.returncode == EXIT_FAILED, done.stderr
    assert "[failed]" in done.stdout


def test_version_is_the_installed_distributions_version() -> None:
    assert wf_magic.__version__ == importlib.metadata.version("wf_magic")


def test_package_ships_py_typed() -> None:
    assert (importlib.resources.files("wf_magic") / "py.typed").is_file()


def test_frame_functions_are_callables_not_shadowing_submodules() -> None:
    for name in FRAME_FUNCTIONS:
        attribute = getattr(wf_magic, name)
        assert callable(attribute), name
        assert not isinstance(attribute, types.ModuleType), name
        assert importlib.util.find_spec(f"wf_magic.{name}") is None, name


def test_executor_factories_are_reexported_from_the_drive() -> None:
    assert wf_magic.thread_executor is executors.thread_executor
    assert wf_magic.dask_executor is executors.dask_executor


def test_dunder_all_is_sorted_and_every_name_resolves() -> None:
    assert wf_magic.__all__ == sorted(wf_magic.__all__)
    assert [name for name in wf_magic.__all__ if not hasattr(wf_magic, name)] == []
