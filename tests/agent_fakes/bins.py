"""Executables named like the real agent CLIs that run the fake harness in their shape."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FAKE = Path(__file__).with_name("fake_agent.py")
SHAPES = ("claude", "codex", "opencode", "gemini")


def make_bins(folder: Path) -> dict[str, Path]:
    """One executable per CLI shape in ``folder``: name → path."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for shape in SHAPES:
        path = folder / shape
        path.write_text(
            f"#!{sys.executable}\nimport runpy, sys\nsys.argv[1:1] = [{shape!r}, {str(folder)!r}]\n"
            f"runpy.run_path({str(FAKE)!r}, run_name='__main__')\n"
        )
        path.chmod(0o755)
        out[shape] = path
    return out


def git_repo(folder: Path) -> Path:
    """A git repository at ``folder`` with one commit (a file ``README``)."""
    folder.mkdir(parents=True, exist_ok=True)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)

    git("init", "-q")
    (folder / "README").write_text("main checkout\n")
    git("add", "README")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init")
    return folder
