#!/usr/bin/env bash
# Install the pinned coding-agent CLIs the real agent tier drives (tests/test_agents_real.py)
# into a cache folder, one `npm install --prefix` per CLI; idempotent (an installed pin is
# kept). The cache: $WF_AGENTS_CACHE, else ~/.cache/wf_magic-agents. Without npm, or when an
# install fails (no registry), it says so and exits 0: the real tier then skips with a reason;
# under CI=true (.ci/run) it exits 1 instead, since a skip there means the tier did not run.
set -uo pipefail
CACHE="${WF_AGENTS_CACHE:-$HOME/.cache/wf_magic-agents}"
PINS=(
  "claude @anthropic-ai/claude-code@2.1.197"
  "codex @openai/codex@0.171.0"
  "opencode opencode-ai@1.18.33"
  "gemini @google/gemini-cli@0.61.0"
)
strict=0
[ "${CI:-}" = "true" ] && strict=1
failed=0
if ! command -v npm >/dev/null 2>&1; then
  echo "ci_agents: npm not found; the real agent tests will skip" >&2
  exit "$strict"
fi
mkdir -p "$CACHE"
for pin in "${PINS[@]}"; do
  name="${pin%% *}"
  spec="${pin#* }"
  version="${spec##*@}"
  prefix="$CACHE/$name-$version"
  if [ -x "$prefix/node_modules/.bin/$name" ]; then
    echo "ci_agents: $spec already in $prefix"
    continue
  fi
  mkdir -p "$prefix"
  if npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$spec" >"$prefix/install.log" 2>&1; then
    echo "ci_agents: installed $spec into $prefix"
  else
    echo "ci_agents: installing $spec failed (see $prefix/install.log); its tests will skip" >&2
    tail -5 "$prefix/install.log" >&2
    failed=1
  fi
done
[ "$failed" -eq 1 ] && [ "$strict" -eq 1 ] && exit 1
exit 0
