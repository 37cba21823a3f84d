"""How each harness is pointed at its bridge, and where its calls would have gone without it.

- ``claude``: ``ANTHROPIC_BASE_URL`` (upstream: the one the user passed, else the public API).
- ``codex``: a ``-c model_providers.<id>.base_url=…`` override of the provider its config
  names (upstream: that provider's ``base_url``); the built-in ``openai`` provider with an
  API key gets a ``wf-bridge`` provider of the same key. A ChatGPT login (``auth.json``, no
  key) cannot be bridged.
- ``gemini``: ``GOOGLE_GEMINI_BASE_URL`` (upstream: the one passed, else the public API).
- ``opencode`` and registered harnesses: not bridged (its provider sits in a config file).
"""

from __future__ import annotations

import errno
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FileRefused
from ..reading import read_bounded_text

ANTHROPIC_API = "https://api.anthropic.com"
OPENAI_API = "https://api.openai.com/v1"
GEMINI_API = "https://generativelanguage.googleapis.com"


@dataclass(frozen=True, slots=True, kw_only=True)
class Wiring:
    """Where a harness's calls go, and what points the CLI at ``{url}`` instead."""

    upstream: str
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for the launch; ``{url}`` stands for the bridge's base URL."""
    argv: tuple[str, ...] = ()
    """Arguments put before the harness's own (``{url}`` as above)."""

    def env_for(self, url: str) -> dict[str, str]:
        return {k: v.replace("{url}", url) for k, v in self.env.items()}

    def argv_for(self, url: str) -> list[str]:
        return [a.replace("{url}", url) for a in self.argv]


class NotBridgeable(Exception):
    """The harness's login cannot be bridged (the reason is the message)."""


def wiring(harness: str, env: Mapping[str, str]) -> Wiring:
    """The wiring of ``harness`` launched with ``env``.

    Raises:
        NotBridgeable: saying why (an unknown harness, a login the bridge cannot relay).
    """
    if harness == "claude":
        upstream = env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_API
        return Wiring(upstream=upstream, env={"ANTHROPIC_BASE_URL": "{url}"})
    if harness == "gemini":
        upstream = env.get("GOOGLE_GEMINI_BASE_URL") or GEMINI_API
        return Wiring(upstream=upstream, env={"GOOGLE_GEMINI_BASE_URL": "{url}"})
    if harness == "codex":
        return _codex(env)
    raise NotBridgeable(f"the bridge does not know how to point {harness} at it")


CONFIG_LIMIT = 1_000_000
"""The largest Codex config.toml read (a config is a few KB)."""


def _codex(env: Mapping[str, str]) -> Wiring:
    home, config = _codex_config(env)
    provider = str(config.get("model_provider") or "openai")
    entry = _codex_provider(config)
    if isinstance(entry, dict) and isinstance(entry.get("base_url"), str):
        key = f"model_providers.{provider}.base_url"
        return Wiring(upstream=entry["base_url"], argv=("-c", key + '="{url}"'))
    if provider != "openai":
        raise NotBridgeable(f"its provider {provider!r} has no base_url in {home}/config.toml")
    if not env.get("OPENAI_API_KEY"):
        raise NotBridgeable("it logs in without OPENAI_API_KEY (a ChatGPT login)")
    upstream = env.get("OPENAI_BASE_URL") or OPENAI_API
    table = '{name="wf-bridge", base_url="{url}", env_key="OPENAI_API_KEY", wire_api="responses"}'
    return Wiring(
        upstream=upstream,
        argv=("-c", 'model_provider="wf-bridge"', "-c", f"model_providers.wf-bridge={table}"),
    )


def _codex_provider(config: Mapping[str, object]) -> object:
    """The entry of the provider Codex's config names (None: not in the config)."""
    provider = str(config.get("model_provider") or "openai")
    providers = config.get("model_providers")
    return providers.get(provider) if isinstance(providers, dict) else None


def _codex_config(env: Mapping[str, str]) -> tuple[Path, dict[str, object]]:
    """Codex's home and its config.toml (empty when there is none).

    Raises:
        NotBridgeable: the config cannot be read.
    """
    home = Path(env.get("CODEX_HOME") or Path(env.get("HOME", "~")) / ".codex").expanduser()
    try:
        return home, tomllib.loads(read_bounded_text(home / "config.toml", limit=CONFIG_LIMIT))
    except FileRefused as exc:
        if exc.reason != "os" or exc.errno != errno.ENOENT:
            raise NotBridgeable(
                f"its config {home / 'config.toml'} cannot be read ({exc})"
            ) from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise NotBridgeable(f"its config {home / 'config.toml'} cannot be read ({exc})") from exc
    return home, {}


REPLAY_KEY = "wf-replay-no-key"
"""The API key a replaying CLI is given when it has none (it never leaves the machine)."""


def replay_wiring(harness: str, env: Mapping[str, str]) -> Wiring:
    """The wiring of ``harness`` replaying from a cassette: as :func:`wiring`, and a
    stand-in API key where the launch has none (the bridge answers; nothing goes upstream).

    Raises:
        NotBridgeable: an unknown harness, an unreadable Codex config.
    """
    given = dict(env)
    keys = {"claude": "ANTHROPIC_API_KEY", "codex": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
    key = keys.get(harness)
    if harness == "codex":  # its config's provider may read its key from another variable
        entry = _codex_provider(_codex_config(env)[1])
        if isinstance(entry, dict) and isinstance(entry.get("env_key"), str):
            key = entry["env_key"]
    added = {}
    if key and not (given.get(key) or (harness == "claude" and given.get("ANTHROPIC_AUTH_TOKEN"))):
        added[key] = given[key] = REPLAY_KEY
    wired = wiring(harness, given)
    return Wiring(upstream=wired.upstream, env={**added, **wired.env}, argv=wired.argv)
