"""The bridge for opencode (issue 35 item 1), and the logins it cannot relay.

opencode's provider sits in its config, so the bridge points it through
``OPENCODE_CONFIG_CONTENT`` (the config opencode reads last) overriding that provider's
``options.baseURL``; the upstream is the ``baseURL`` the user's configs give it, else a
built-in provider's public API. The real opencode CLI is driven through the bridge to the
fake Chat Completions backend (tests/agent_backends.py); those tests skip when it is absent.
Claude under Bedrock/Vertex/Foundry and Gemini without an API-key login are not bridgeable:
one warning names the harness.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_backends import (
    USAGE_IN,
    USAGE_OUT,
    Backend,
    Step,
    opencode_config,
    start_backend,
)
from tests.agent_fakes.bins import git_repo, make_bins
from tests.conftest import run_wf, wait_for
from tests.helpers_http import isolate_loopback_env
from tests.test_agents_real import _require, work
from wf_magic import Engine
from wf_magic.bridge.wiring import (
    OPENCODE_APIS,
    REPLAY_KEY,
    NotBridgeable,
    replay_wiring,
    wiring,
)

URL = "http://127.0.0.1:4242/SECRET"
KEY = "sk-opencode-fake-key-0123456789"


def _config(base_url: str | None = "http://proxy.example/v1", **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"npm": "@ai-sdk/openai-compatible", "options": dict(options)}
    if base_url is not None:
        entry["options"]["baseURL"] = base_url
    return {"model": "fake/fake-model", "provider": {"fake": entry}}


def _content(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(env["OPENCODE_CONFIG_CONTENT"])


# -- wiring, without the CLI ------------------------------------------------------------------


def test_opencode_is_pointed_at_the_bridge_by_its_config_content_and_keeps_the_users_key(
    tmp_path: Path,
) -> None:
    config = tmp_path / "opencode.json"
    config.write_text(json.dumps(_config(apiKey="{env:FAKE_KEY}")))
    own = {"share": "disabled", "provider": {"fake": {"options": {"headers": {"x-team": "a"}}}}}
    env = {
        "HOME": str(tmp_path / "home"),
        "OPENCODE_CONFIG": str(config),
        "OPENCODE_CONFIG_CONTENT": json.dumps(own),
        "FAKE_KEY": KEY,
    }
    wired = wiring("opencode", env)
    assert wired.upstream == "http://proxy.example/v1"
    assert wired.argv == ()
    given = wired.env_for(URL)
    assert list(given) == ["OPENCODE_CONFIG_CONTENT"]  # the key variable is left alone
    assert _content(given) == {
        "share": "disabled",
        "provider": {"fake": {"options": {"headers": {"x-team": "a"}, "baseURL": URL}}},
    }
    assert KEY not in json.dumps(given)


def test_the_upstream_is_the_project_configs_base_url_with_its_env_reference_resolved(
    tmp_path: Path,
) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "opencode.jsonc").write_text(
        "// the team's proxy\n"
        + json.dumps(_config("{env:PROXY}/v1"))[:-2]
        + ",}, /* a trailing comma */ }\n"
    )
    (repo / "sub").mkdir()
    (repo / "sub" / "opencode.json").write_text(json.dumps({"provider": {"other": {}}}))
    env = {"HOME": str(tmp_path / "home"), "PROXY": "http://127.0.0.1:9999"}
    wired = wiring("opencode", env, model="fake/fake-model", cwd=str(repo / "sub"))
    assert wired.upstream == "http://127.0.0.1:9999/v1"
    assert _content(wired.env_for(URL)) == {"provider": {"fake": {"options": {"baseURL": URL}}}}


@pytest.mark.parametrize("provider", sorted(OPENCODE_APIS))
def test_a_built_in_provider_without_a_base_url_goes_to_its_public_api(
    tmp_path: Path, provider: str
) -> None:
    env = {"HOME": str(tmp_path)}
    wired = wiring("opencode", env, model=f"{provider}/some-model", cwd=str(tmp_path))
    assert wired.upstream == OPENCODE_APIS[provider]
    assert _content(wired.env_for(URL))["provider"][provider]["options"]["baseURL"] == URL


def test_the_steps_model_chooses_the_provider_over_the_configs(tmp_path: Path) -> None:
    config = _config()
    config["provider"]["local"] = {"options": {"baseURL": "http://127.0.0.1:11434/v1"}}
    env = {"HOME": str(tmp_path), "OPENCODE_CONFIG_CONTENT": json.dumps(config)}
    assert wiring("opencode", env).upstream == "http://proxy.example/v1"
    wired = wiring("opencode", env, model="local/llama")
    assert wired.upstream == "http://127.0.0.1:11434/v1"
    assert _content(wired.env_for(URL))["provider"]["local"]["options"]["baseURL"] == URL


UNBRIDGEABLE = [
    ({}, None, "it names no PROVIDER/MODEL"),
    ({}, "openrouter/x", "its provider 'openrouter' has no options.baseURL in its config"),
    ({}, "openai/gpt-5", "its provider 'openai' has no options.baseURL in the configs read, and"),
    ({"auth": {"anthropic": {"type": "oauth"}}}, "anthropic/claude", "it logs in to 'anthropic'"),
    ({"config": "{not json"}, None, "its config "),
    (
        {"config": json.dumps(_config("{file:~/.base}"))},
        None,
        "its provider 'fake' reads its baseURL from a file",
    ),
]


@pytest.mark.parametrize(("files", "model", "reason"), UNBRIDGEABLE)
def test_an_opencode_login_the_bridge_cannot_relay_says_why(
    tmp_path: Path, files: dict[str, Any], model: str | None, reason: str
) -> None:
    env = {"HOME": str(tmp_path)}
    if "auth" in files:
        auth = tmp_path / ".local" / "share" / "opencode" / "auth.json"
        auth.parent.mkdir(parents=True)
        auth.write_text(json.dumps(files["auth"]))
    if "config" in files:
        (tmp_path / "opencode.json").write_text(files["config"])
        env["OPENCODE_CONFIG"] = str(tmp_path / "opencode.json")
    with pytest.raises(NotBridgeable) as caught:
        wiring("opencode", env, model=model)
    assert str(caught.value).startswith(reason)


def test_a_replayed_opencode_gets_a_stand_in_key_only_where_it_has_none(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "OPENCODE_CONFIG_CONTENT": json.dumps(_config(apiKey="{env:K}"))}
    assert replay_wiring("opencode", env).env_for(URL)["K"] == REPLAY_KEY
    assert "K" not in replay_wiring("opencode", {**env, "K": KEY}).env_for(URL)
    wired = replay_wiring(
        "opencode", {"HOME": str(tmp_path)}, model="openai/gpt-5", cwd=str(tmp_path)
    )
    assert wired.env_for(URL)["OPENAI_API_KEY"] == REPLAY_KEY


def _gemini_home(tmp_path: Path, selected: str) -> str:
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"security": {"auth": {"selectedType": selected}}}))
    return str(tmp_path)


CLOUDS = [
    ("claude", {"CLAUDE_CODE_USE_BEDROCK": "1"}, "it calls Amazon Bedrock"),
    ("claude", {"CLAUDE_CODE_USE_VERTEX": "true"}, "it calls Google Vertex AI"),
    ("gemini", {"GOOGLE_GENAI_USE_VERTEXAI": "true"}, "it calls Vertex AI"),
    ("gemini", {"HOME": "oauth-personal"}, "it logs in with oauth-personal"),
]


@pytest.mark.parametrize(("harness", "env", "reason"), CLOUDS)
def test_claude_on_a_cloud_and_gemini_without_an_api_key_are_not_bridgeable(
    tmp_path: Path, harness: str, env: dict[str, str], reason: str
) -> None:
    if env.get("HOME"):
        env = {"HOME": _gemini_home(tmp_path, env["HOME"])}
    with pytest.raises(NotBridgeable) as caught:
        wiring(harness, {"HOME": str(tmp_path), **env})
    assert str(caught.value).startswith(reason)


@pytest.mark.parametrize("off", ["0", "false", ""])
def test_a_cloud_flag_set_off_leaves_claude_and_gemini_bridged(tmp_path: Path, off: str) -> None:
    flags = {"CLAUDE_CODE_USE_BEDROCK": off, "GOOGLE_GENAI_USE_VERTEXAI": off}
    home = _gemini_home(tmp_path, "gemini-api-key")
    assert wiring("claude", {"HOME": home, **flags}).upstream == "https://api.anthropic.com"
    assert wiring("gemini", {"HOME": home, **flags}).upstream.startswith("https://generative")


@pytest.mark.parametrize(
    ("harness", "variable", "said"),
    [
        ("claude", "CLAUDE_CODE_USE_BEDROCK", "it calls Amazon Bedrock"),
        ("gemini", "GOOGLE_GENAI_USE_VERTEXAI", "it calls Vertex AI"),
    ],
)
def test_an_unbridgeable_login_runs_unbridged_with_one_warning_naming_the_harness(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    harness: str,
    variable: str,
    said: str,
) -> None:
    bins = make_bins(tmp_path / "bin")
    repo = git_repo(tmp_path / "repo")
    monkeypatch.setenv(variable, "true")
    path = repo / "wf.yaml"
    path.write_text(
        f"name: unbridged\nsteps:\n  - id: fix\n    agent: {harness}\n    prompt: hi\n"
        f"    map: '{{{{ [1, 2] }}}}'\n    pass_env: [{variable}]\n"
        f"runners:\n  {harness}: {{bin: {bins[harness]}}}\n"
    )
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    warned = [
        json.loads(e.data_json or "{}")
        for e in engine.store.events_after(run.run_id)
        if e.kind == "warning"
    ]
    assert [w["message"] for w in warned] == [
        f"{harness}: not bridged ({said} ({variable} is set), which the bridge cannot relay); "
        "calls are not journaled"
    ]
    assert engine.calls(run.run_id).empty


# -- the real opencode CLI through the bridge -------------------------------------------------

PRICES = "prices: {fake-model: {input_per_mtok: 3, output_per_mtok: 15}}"


@pytest.fixture
def model_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    isolate_loopback_env(monkeypatch)
    served = start_backend()
    yield served
    served.stop()


def opencode_workflow(
    repo: Path, model_api: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, prompt: str
) -> Path:
    """An opencode workflow whose configured provider is ``model_api`` (its key read from
    ``FAKE_OPENCODE_KEY``), priced like the provider model's configured cost."""
    cli = _require("opencode")
    config = tmp_path / "opencode.json"
    config.write_text(
        json.dumps(
            opencode_config(base_url=f"{model_api.url}/v1", api_key="{env:FAKE_OPENCODE_KEY}")
        )
    )
    monkeypatch.setenv("OPENCODE_CONFIG", str(config))
    monkeypatch.setenv("FAKE_OPENCODE_KEY", KEY)
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")  # it looks plugins up
    path = repo / "real-opencode.yaml"
    path.write_text(
        "name: bridgedopencode\nsteps:\n  - id: fix\n    agent: opencode\n"
        f"    prompt: {json.dumps(prompt)}\n    model: fake/fake-model\n    timeout: 180\n"
        "    pass_env: [OPENCODE_CONFIG, FAKE_OPENCODE_KEY, NPM_CONFIG_REGISTRY]\n"
        f"runners:\n  opencode: {{bin: {cli}, {PRICES}}}\n"
    )
    return path


def _chat_requests(served: Backend) -> list[dict[str, Any]]:
    return [r for r in served.requests if r["path"].endswith("/chat/completions")]


def test_real_opencode_every_call_is_journaled_and_the_attempt_is_their_sum(
    engine: Engine, model_api: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path / "repo")
    path = opencode_workflow(repo, model_api, monkeypatch, tmp_path, "Make [[write hello.txt]]")
    run = engine.run(str(path))
    assert run.status == "completed", run.reason
    assert (repo / "hello.txt").read_text() == "written by the agent\n"
    [attempt] = work(engine, run.run_id)
    served = _chat_requests(model_api)
    assert [r["path"] for r in served] == ["/v1/chat/completions"] * 2  # the tool call, the answer
    assert [r["headers"]["authorization"] for r in served] == [f"Bearer {KEY}"] * 2
    calls = engine.calls(run.run_id)
    assert list(calls["call"]) == [1, 2]
    assert list(calls["model"]) == [r["body"]["model"] for r in served]
    assert list(calls["status"]) == ["ok", "ok"]
    assert list(calls["tokens_in"]) == [USAGE_IN, USAGE_IN]
    assert list(calls["tokens_out"]) == [USAGE_OUT, USAGE_OUT]
    assert set(calls["dispatch_id"]) == {attempt.dispatch_id}
    assert set(calls["price_source"]) == {"runners.opencode.prices"}
    assert (attempt.tokens_in, attempt.tokens_out) == (2 * USAGE_IN, 2 * USAGE_OUT)
    assert attempt.cost == pytest.approx(float(calls["cost"].sum()))
    assert attempt.cost == pytest.approx(2 * (USAGE_IN * 3 + USAGE_OUT * 15) / 1e6)
    facts = engine.store.agent_facts(attempt.dispatch_id)
    assert facts is not None and facts["bridge"]["calls"] == 2
    report = facts["bridge"]["cli_report"]  # opencode's own sum of its step_finish events
    assert (report["tokens_in"], report["tokens_out"]) == (2 * USAGE_IN, 2 * USAGE_OUT)
    assert report["cost"] == pytest.approx(attempt.cost)
    listed = json.loads(run_wf(engine.state_dir, "calls", run.run_id, "--format", "json").stdout)
    assert [(c["call"], c["tokens_in"], c["tokens_out"]) for c in listed] == [
        (1, USAGE_IN, USAGE_OUT),
        (2, USAGE_IN, USAGE_OUT),
    ]
    shown = run_wf(engine.state_dir, "show", run.run_id, "fix").stdout
    assert "calls      2 through the bridge: 240 in / 16 out" in shown
    assert "DISAGREE" not in shown
    engine.close()
    leaked = [
        p for p in engine.state_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()
    ]
    assert leaked == []


def _bridge_url(config: Path) -> str | None:
    """The bridge URL a live opencode given ``config`` was pointed at (read from its env)."""
    marker = f"OPENCODE_CONFIG={config}".encode()
    for entry in Path("/proc").iterdir():
        try:
            items = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if marker in items:
            for item in items:
                if item.startswith(b"OPENCODE_CONFIG_CONTENT="):
                    content = json.loads(item.split(b"=", 1)[1])
                    return str(content["provider"]["fake"]["options"]["baseURL"])
    return None


def test_real_opencode_bridge_refuses_a_call_without_the_attempts_secret(
    engine: Engine, model_api: Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = git_repo(tmp_path / "repo")
    path = opencode_workflow(repo, model_api, monkeypatch, tmp_path, "Fix it.")
    model_api.script.append(Step(delay_s=4.0))  # holds the CLI's first call while we knock
    done: list[Any] = []
    driver = threading.Thread(target=lambda: done.append(engine.run(str(path))))
    driver.start()
    try:
        wait_for(lambda: len(_chat_requests(model_api)) == 1, timeout=60, what="the first call")
        url = _bridge_url(tmp_path / "opencode.json")
        assert url is not None
        port, secret = url.removeprefix("http://127.0.0.1:").split("/", 1)
        assert len(secret) >= 32
        for path_tried in ("/v1/chat/completions", f"/{secret[:-1]}/chat/completions", "/"):
            answer = httpx.post(
                f"http://127.0.0.1:{port}{path_tried}",
                json={"model": "fake-model", "messages": []},
                headers={"authorization": f"Bearer {KEY}"},
                trust_env=False,
                timeout=10,
            )
            assert answer.status_code == 404, path_tried
        assert len(_chat_requests(model_api)) == 1  # nothing was forwarded
    finally:
        driver.join(timeout=200)
    [run] = done
    assert run.status == "completed", run.reason
    assert len(engine.calls(run.run_id)) == 1  # the refused knocks are no calls
    with pytest.raises(httpx.ConnectError):  # the port closed with the attempt
        httpx.post(url + "/chat/completions", content=b"{}", trust_env=False, timeout=5)


def test_codex_without_a_config_file_and_with_an_api_key_is_bridged(tmp_path: Path) -> None:
    # a missing config.toml is no config (it was refused as unreadable)
    env = {"HOME": str(tmp_path), "OPENAI_API_KEY": KEY}
    wired = wiring("codex", env)
    assert wired.upstream == "https://api.openai.com/v1"
    assert wired.argv_for(URL)[:2] == ["-c", 'model_provider="wf-bridge"']
