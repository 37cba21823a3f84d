#!/usr/bin/env bash
# Install what the browser test (tests/browser/) needs: Debian's Chromium and, into the venv
# given as $1, JupyterLab + Playwright (+ the kernel pieces). Never runs `playwright install`:
# the test drives /usr/bin/chromium. Usage: scripts/ci_browser.sh VENV [--run]
set -euo pipefail

VENV=${1:?usage: scripts/ci_browser.sh VENV [--run]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no python in $VENV (create it with: python3 -m venv $VENV)" >&2; exit 2; }

if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi

"$PY" -m pip install -q "jupyterlab>=4.2" "ipywidgets>=8.1" "ipykernel>=6.29" "playwright>=1.45" \
    psutil pytest
if ! "$PY" -c "import wf_magic" 2>/dev/null; then
    "$PY" -m pip install -q -e "$ROOT"
fi

echo "chromium: $(/usr/bin/chromium --version 2>/dev/null | tail -1)"
"$PY" -c "import jupyterlab, playwright, ipywidgets; from importlib.metadata import version as v; \
print('jupyterlab', jupyterlab.__version__, '| playwright', v('playwright'), '| ipywidgets', ipywidgets.__version__)"

if [ "${2:-}" = "--run" ]; then
    cd "$ROOT"
    exec "$PY" -m pytest -m browser tests/browser -p no:cacheprovider -q
fi
