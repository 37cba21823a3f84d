"""How each harness is pointed at its bridge, and where its calls would have gone without it.

- ``claude``: ``ANTHROPIC_BASE_URL`` (upstream: the one the user passed, else the public API).
  Bedrock, Vertex AI and Foundry (``CLAUDE_CODE_USE_*``) cannot be bridged.
- ``codex``: a ``-c model_providers.<id>.base_url=…`` override of the provider its config
  names (upstream: that provider's ``base_url``); the built-in ``openai`` provider with an
  API key gets a ``wf-bridge`` provider of the same key. A ChatGPT login (``auth.json``, no
  key) cannot be bridged.
- ``opencode``: ``OPENCODE_CONFIG_CONTENT`` (the config opencode reads last) overriding the
  ``options.baseURL`` of the provider of its model (upstream: that provider's ``baseURL`` in
  its configs, else the public API of a built-in provider). An OAuth login cannot be bridged.
- ``gemini``: ``GOOGLE_GEMINI_BASE_URL`` (upstream: the one passed, else the public API);
  only an API-key login (Vertex AI, a Google account login cannot be bridged).
- registered harnesses: not bridged.
"""

from __future__ import annotations

import errno
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FileRefused
from ..reading import read_bounded_text

ANTHROPIC_API = "https://api.anthropic.com"
OPENAI_API = "https://api.openai.com/v1"
GEMINI_API = "https://generativelanguage.googleapis.com"
OPENCODE_APIS = {
    "openai": OPENAI_API,
    "anthropic": ANTHROPIC_API + "/v1",
    "google": GEMINI_API + "/v1beta",
}
"""The public API of opencode's built-in providers (their AI SDK package's default base URL)."""
OPENCODE_KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "google": "GOOGLE_GENERATIVE_AI_API_KEY",
}
"""The variable each built-in opencode provider reads its API key from."""


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


def wiring(
    harness: str, env: Mapping[str, str], *, model: str | None = None, cwd: str | None = None
) -> Wiring:
    """The wiring of ``harness`` launched with ``env``.

    ``model`` (the step's) and ``cwd`` (the agent's folder) tell which of opencode's
    providers is used and where its project configs are; without them only its own
    ``model`` and the configs named by ``env`` are read.

    Raises:
        NotBridgeable: saying why (an unknown harness, a login the bridge cannot relay).
    """
    if harness == "claude":
        _refuse_flags(env, CLAUDE_CLOUDS)
        upstream = env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_API
        return Wiring(upstream=upstream, env={"ANTHROPIC_BASE_URL": "{url}"})
    if harness == "gemini":
        _gemini_login(env)
        upstream = env.get("GOOGLE_GEMINI_BASE_URL") or GEMINI_API
        return Wiring(upstream=upstream, env={"GOOGLE_GEMINI_BASE_URL": "{url}"})
    if harness == "codex":
        return _codex(env)
    if harness == "opencode":
        return _opencode(OpencodeConfig.read(env, model=model, cwd=cwd))
    raise NotBridgeable(f"the bridge does not know how to point {harness} at it")


CONFIG_LIMIT = 1_000_000
"""The largest config file read (Codex's config.toml, opencode's and Gemini's JSON: a few KB)."""

CLAUDE_CLOUDS = {
    "CLAUDE_CODE_USE_BEDROCK": "Amazon Bedrock",
    "CLAUDE_CODE_USE_VERTEX": "Google Vertex AI",
    "CLAUDE_CODE_USE_FOUNDRY": "Microsoft Foundry",
}
GEMINI_CLOUDS = {"GOOGLE_GENAI_USE_VERTEXAI": "Vertex AI", "GOOGLE_GENAI_USE_GCA": "a Google login"}


def _refuse_flags(env: Mapping[str, str], flags: Mapping[str, str]) -> None:
    """Raise NotBridgeable for the first of ``flags`` set true in ``env`` (its API is not the
    one the base URL variable redirects)."""
    for flag, cloud in flags.items():
        if (env.get(flag) or "").strip().lower() in ("1", "true", "yes", "on"):
            raise NotBridgeable(f"it calls {cloud} ({flag} is set), which the bridge cannot relay")


def _gemini_login(env: Mapping[str, str]) -> None:
    """Raise NotBridgeable unless Gemini CLI logs in with an API key (only that login goes
    to ``GOOGLE_GEMINI_BASE_URL``)."""
    _refuse_flags(env, GEMINI_CLOUDS)
    path = Path(env.get("HOME", "~")).expanduser() / ".gemini" / "settings.json"
    settings = _json_file(path)
    security = settings.get("security")
    auth = security.get("auth") if isinstance(security, dict) else None
    chosen = auth.get("selectedType") if isinstance(auth, dict) else None
    chosen = chosen or settings.get("selectedAuthType")  # the settings' first layout
    if isinstance(chosen, str) and chosen != "gemini-api-key":
        raise NotBridgeable(
            f"it logs in with {chosen} (security.auth.selectedType in {path}), not an API key"
        )


# -- codex ---------------------------------------------------------------------------------


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
        if not _absent(exc):
            raise NotBridgeable(
                f"its config {home / 'config.toml'} cannot be read ({exc})"
            ) from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise NotBridgeable(f"its config {home / 'config.toml'} cannot be read ({exc})") from exc
    return home, {}


# -- opencode ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OpencodeConfig:
    """opencode's configuration as a launch would see it, and the provider its model uses."""

    env: Mapping[str, str]
    merged: Mapping[str, Any]
    """Its config files merged in opencode's order (global, ``OPENCODE_CONFIG``, the
    project's from the repository root down to ``cwd``, ``OPENCODE_CONFIG_DIR``'s,
    ``OPENCODE_CONFIG_CONTENT``)."""
    provider: str
    """The provider id of the model (``PROVIDER/MODEL``)."""
    project_read: bool
    """Whether the project's configs were read (the agent's folder was known)."""

    @classmethod
    def read(cls, env: Mapping[str, str], *, model: str | None, cwd: str | None) -> OpencodeConfig:
        """The configs ``env`` names (and the project's of ``cwd``) with ``model``'s provider.

        Raises:
            NotBridgeable: a config cannot be read, or no model names a provider.
        """
        home = Path(env.get("HOME", "~")).expanduser()
        configs = Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "opencode"
        paths = [configs / n for n in ("config.json", "opencode.json", "opencode.jsonc")]
        if env.get("OPENCODE_CONFIG"):
            paths.append(Path(env["OPENCODE_CONFIG"]).expanduser())
        if cwd is not None:
            paths += _project_configs(Path(cwd))
        if env.get("OPENCODE_CONFIG_DIR"):
            folder = Path(env["OPENCODE_CONFIG_DIR"]).expanduser()
            paths += [folder / "opencode.json", folder / "opencode.jsonc"]
        merged: dict[str, Any] = {}
        for path in paths:
            _merge(merged, _json_file(path))
        if env.get("OPENCODE_CONFIG_CONTENT"):
            _merge(merged, _jsonc(env["OPENCODE_CONFIG_CONTENT"], where="OPENCODE_CONFIG_CONTENT"))
        chosen = model or merged.get("model")
        providers = merged.get("provider")
        if isinstance(chosen, str) and "/" in chosen:
            provider = chosen.split("/", 1)[0]
        elif isinstance(providers, dict) and len(providers) == 1:
            provider = str(next(iter(providers)))
        else:
            raise NotBridgeable(
                "it names no PROVIDER/MODEL (give the step a model, or its config a model)"
            )
        return cls(env=env, merged=merged, provider=provider, project_read=cwd is not None)

    @property
    def entry(self) -> Mapping[str, Any]:
        """The provider's entry in the config (empty: a built-in provider as shipped)."""
        providers = self.merged.get("provider")
        entry = providers.get(self.provider) if isinstance(providers, dict) else None
        return entry if isinstance(entry, dict) else {}

    @property
    def options(self) -> Mapping[str, Any]:
        options = self.entry.get("options")
        return options if isinstance(options, dict) else {}

    def substitute(self, value: str) -> str:
        """``value`` with opencode's ``{env:NAME}`` replaced as the launch will see it.

        Raises:
            NotBridgeable: it reads a file (``{file:…}``).
        """
        if "{file:" in value:
            raise NotBridgeable(f"its provider {self.provider!r} reads its baseURL from a file")
        return re.sub(r"\{env:([^}]+)\}", lambda m: self.env.get(m.group(1), ""), value)


def _opencode(config: OpencodeConfig) -> Wiring:
    provider = config.provider
    _opencode_login(config)
    given = config.options.get("baseURL")
    upstream = config.substitute(given) if isinstance(given, str) else ""
    if not upstream and provider in OPENCODE_APIS and not config.project_read:
        # A project's opencode.json may point a built-in provider at a proxy: unread, the
        # user's key could be relayed to the public API instead.
        raise NotBridgeable(
            f"its provider {provider!r} has no options.baseURL in the configs read, and the "
            "project's configs were not (the agent's folder is unknown)"
        )
    upstream = upstream or OPENCODE_APIS.get(provider, "")
    if not upstream:
        raise NotBridgeable(
            f"its provider {provider!r} has no options.baseURL in its config and no public "
            "API the bridge knows"
        )
    content: dict[str, Any] = {}
    if config.env.get("OPENCODE_CONFIG_CONTENT"):  # the user's own: kept, with one override
        content = _jsonc(config.env["OPENCODE_CONFIG_CONTENT"], where="OPENCODE_CONFIG_CONTENT")
    _merge(content, {"provider": {provider: {"options": {"baseURL": "{url}"}}}})
    return Wiring(upstream=upstream, env={"OPENCODE_CONFIG_CONTENT": json.dumps(content)})


def _opencode_login(config: OpencodeConfig) -> None:
    """Raise NotBridgeable when opencode logs in to the provider other than with a key
    (``opencode auth login`` with OAuth: its requests go to the account's own endpoint)."""
    home = Path(config.env.get("HOME", "~")).expanduser()
    data = Path(config.env.get("XDG_DATA_HOME") or home / ".local" / "share")
    path = data / "opencode" / "auth.json"
    entry = _json_file(path).get(config.provider)
    kind = entry.get("type") if isinstance(entry, dict) else None
    if isinstance(kind, str) and kind != "api":
        raise NotBridgeable(f"it logs in to {config.provider!r} with {kind} ({path}), not a key")


def _opencode_key(config: OpencodeConfig) -> str | None:
    """The variable the provider's API key is read from (None: the key is in the config, or
    the provider needs none)."""
    key = config.options.get("apiKey")
    if isinstance(key, str):
        named = re.fullmatch(r"\{env:([^}]+)\}", key.strip())
        return named.group(1) if named else None
    return OPENCODE_KEYS.get(config.provider)


def _project_configs(cwd: Path) -> list[Path]:
    """opencode's project configs of ``cwd``, the farthest first: ``opencode.json(c)`` and
    ``.opencode/opencode.json(c)`` from ``cwd`` up to the repository root."""
    folders = []
    for folder in (cwd, *cwd.parents):
        folders.append(folder)
        if (folder / ".git").exists():
            break
    names = (
        "opencode.json",
        "opencode.jsonc",
        ".opencode/opencode.json",
        ".opencode/opencode.jsonc",
    )
    return [folder / name for folder in reversed(folders) for name in names]


_JSONC = re.compile(r'("(?:\\.|[^"\\])*")|//[^\n]*|/\*.*?\*/', re.S)
_TRAILING = re.compile(r'("(?:\\.|[^"\\])*")|,(?=\s*[}\]])')


def _jsonc(text: str, *, where: str | Path) -> dict[str, Any]:
    """JSON with comments and trailing commas, as opencode and Gemini CLI read it.

    Raises:
        NotBridgeable: it is no JSON object.
    """
    plain = _TRAILING.sub(lambda m: m.group(1) or "", _JSONC.sub(lambda m: m.group(1) or "", text))
    try:
        value = json.loads(plain)
    except ValueError as exc:
        raise NotBridgeable(f"its config {where} cannot be read ({exc})") from exc
    if not isinstance(value, dict):
        raise NotBridgeable(f"its config {where} is no JSON object")
    return value


def _json_file(path: Path) -> dict[str, Any]:
    """The JSON(C) object in ``path`` (empty when there is none).

    Raises:
        NotBridgeable: it cannot be read.
    """
    try:
        text = read_bounded_text(path, limit=CONFIG_LIMIT)
    except FileRefused as exc:
        if _absent(exc):
            return {}
        raise NotBridgeable(f"its config {path} cannot be read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise NotBridgeable(f"its config {path} cannot be read ({exc})") from exc
    return _jsonc(text, where=path)


def _absent(refused: FileRefused) -> bool:
    """Whether the file is simply not there (no config: the defaults)."""
    return refused.reason == "missing" or refused.errno in (errno.ENOENT, errno.ENOTDIR)


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Merge ``other`` into ``into`` as opencode merges its configs (objects key by key)."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = json.loads(json.dumps(value)) if isinstance(value, dict) else value


# -- replay --------------------------------------------------------------------------------

REPLAY_KEY = "wf-replay-no-key"
"""The API key a replaying CLI is given when it has none (it never leaves the machine)."""


def replay_wiring(
    harness: str, env: Mapping[str, str], *, model: str | None = None, cwd: str | None = None
) -> Wiring:
    """The wiring of ``harness`` replaying from a cassette: as :func:`wiring`, and a
    stand-in API key where the launch has none (the bridge answers; nothing goes upstream).

    Raises:
        NotBridgeable: an unknown harness, an unreadable config, a login that cannot be bridged.
    """
    given = dict(env)
    keys = {"claude": "ANTHROPIC_API_KEY", "codex": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
    key = keys.get(harness)
    if harness == "codex":  # its config's provider may read its key from another variable
        entry = _codex_provider(_codex_config(env)[1])
        if isinstance(entry, dict) and isinstance(entry.get("env_key"), str):
            key = entry["env_key"]
    if harness == "opencode":
        key = _opencode_key(OpencodeConfig.read(env, model=model, cwd=cwd))
    added = {}
    if key and not (given.get(key) or (harness == "claude" and given.get("ANTHROPIC_AUTH_TOKEN"))):
        added[key] = given[key] = REPLAY_KEY
    wired = wiring(harness, given, model=model, cwd=cwd)
    return Wiring(upstream=wired.upstream, env={**added, **wired.env}, argv=wired.argv)
