"""The agent runner: one coding-agent CLI launch per attempt, as a subprocess in its own process
group, in its workdir or a worktree, with its own HOME, timed out, streamed, journaled.

It reuses the exec runner's machinery: the minimal environment, the process-group kill at
the timeout or an interrupt, and the sidecar of the running group (``runners/orphans.py``)
that lets a reclaimed attempt reap what a killed driver left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ..bridge.attempt import BridgedAttempt
from ..bridge.wiring import NotBridgeable, Wiring, replay_wiring, wiring
from ..errors import RunnerError
from ..redact import Redactor
from ..runners.base import (
    BaseRunner,
    RunnerContext,
    UnitRequest,
    UnitResult,
    check_limits,
    strip_code_fence,
)
from ..runners.orphans import forget_unit_process, record_unit_process
from ..runners.process import _kill_group
from . import replaying, sidecars, usage, worktrees
from .facts import attempt_facts, unit_output
from .harness import (
    AgentCall,
    AgentError,
    Failure,
    Harness,
    Outcome,
    Watch,
    first_line,
    parse_lines,
)
from .launchenv import agent_workdir, launch_env, pass_env_names
from .stream import StreamReader, cli_version

OUTPUT_CAP_BYTES = 8 * 1_048_576
_OPTIONS = ("bin", "args", "home", "output_cap", "bridge", "prices", "local", "replay", "limits")


class AgentRunner(BaseRunner):
    """Runs ``agent:`` units of one harness (``runners: {<harness>: {bin, args, home}}``)."""

    def __init__(
        self,
        *,
        name: str,
        adapter: Harness,
        bin: str | None = None,
        args: list[str] | None = None,
        home: str = "isolated",
        output_cap: int = OUTPUT_CAP_BYTES,
        state_dir: str = "",
        source_dir: str | None = None,
        bridge: bool = True,
        options: dict[str, Any] | None = None,
        replay: str | None = None,
    ):
        if home not in ("isolated", "user"):
            raise ValueError(f"home: expected isolated or user (got {home!r})")
        self.name = name
        self.adapter = adapter
        self.bin = bin or adapter.default_bin
        self.args = [str(a) for a in (args or [])]
        self.home = home
        self.output_cap = output_cap
        self.state_dir = str(Path(state_dir).resolve()) if state_dir else state_dir
        """Absolute: git and the CLI run in other folders (a relative WF_MAGIC_HOME)."""
        self.source_dir = source_dir
        self.bridge = bridge
        """Whether model calls go through a per-attempt bridge (``runners: {NAME: {bridge}}``)."""
        self.options = dict(options or {})
        """The ``runners:`` section (its ``prices:``/``local:`` price the bridged calls)."""
        self.cassette = replaying.Cassette(replay) if replay else None
        """``runners: {NAME: {replay: PATH}}``: calls answered from this cassette, offline."""
        self._bridge_warned = False
        self._version: str | None = None
        self._live: dict[str, subprocess.Popen[bytes]] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_context(cls, ctx: RunnerContext, *, name: str, adapter: Harness) -> AgentRunner:
        """Factory; unknown option keys are refused (they may be typos of bin/args/home)."""
        unknown = sorted(set(ctx.options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for harness {name!r}; known: {_OPTIONS}")
        args = ctx.options.get("args") or []
        if not isinstance(args, list):
            raise ValueError(f"args: expected a list of strings (got {type(args).__name__})")
        bridge = ctx.options.get("bridge", True)
        if not isinstance(bridge, bool):
            raise ValueError(f"bridge: expected true or false (got {bridge!r})")
        replay = replaying.option(ctx.options.get("replay"), bridge=bridge)
        if "limits" in ctx.options:  # the bridged calls' concurrency and pacing, per model
            try:
                check_limits(ctx.options["limits"], name)
            except RunnerError as exc:
                raise ValueError(str(exc).rstrip(".")) from None
        return cls(
            name=name,
            adapter=adapter,
            bin=ctx.options.get("bin"),
            args=args,
            home=str(ctx.options.get("home", "isolated")),
            output_cap=int(ctx.options.get("output_cap", OUTPUT_CAP_BYTES)),
            state_dir=ctx.state_dir,
            source_dir=ctx.source_dir,
            bridge=bridge,
            options=dict(ctx.options),
            replay=replay,
        )

    def close(self) -> None:
        """Kill the process group of every launch still running (the drive ended)."""
        with self._lock:
            live = list(self._live)
        for dispatch_id in live:
            self.cancel(dispatch_id)

    def cancel(self, dispatch_id: str) -> None:
        """End the launch of ``dispatch_id`` (a Stop, an interrupt): its group is killed and
        the attempt fails transient ("stopped")."""
        with self._lock:
            proc = self._live.get(dispatch_id)
            self._cancelled.add(dispatch_id)
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def version(self, *, env: dict[str, str], cwd: str) -> str | None:
        """The CLI's ``--version`` line, asked like the agent is run (``env``: the launch's
        minimal environment, isolated HOME and quiet settings; once per binary and mtime)."""
        if self._version is None:
            self._version = cli_version(self.bin, env=env, cwd=cwd)
        return self._version or None

    def run(self, request: UnitRequest) -> UnitResult:
        if request.kind != "agent" or request.agent is None:
            raise RunnerError(
                f"runner {self.name!r} runs agent: steps only (step {request.step_id} is a "
                f"{request.kind} step); give it another runner",
                executed=False,
            )
        plan = _Launch.prepare(self, request)
        try:
            return plan.execute()
        finally:
            forget_unit_process(self.state_dir, request.dispatch_id)
            with self._lock:
                self._live.pop(request.dispatch_id, None)


class _Launch:
    """One launch of an attempt: where it runs, which session, and the reading of its output."""

    def __init__(self, runner: AgentRunner, request: UnitRequest, call: AgentCall, **kw: Any):
        self.runner, self.request, self.call = runner, request, call
        self.repo: Path | None = kw["repo"]
        self.worktree: Path | None = kw["worktree"]
        self.sidecar: sidecars.Sidecar = kw["sidecar"]
        self.usage_base: tuple[int, int] = kw["usage_base"]
        self.env: dict[str, str] = kw["env"]
        self.reclaimed: bool = kw["reclaimed"]
        self.bridged: BridgedAttempt | None = None
        self.bridge_note: str | None = None
        self.notes: list[str] = []
        self.leftover: str | None = None
        self.redactor = Redactor.from_environ(
            request.env, extra=[request.env[k] for k in pass_env_names(request) if k in request.env]
        )

    @classmethod
    def prepare(cls, runner: AgentRunner, request: UnitRequest) -> _Launch:
        agent = dict(request.agent or {})
        state, run_id, dispatch = runner.state_dir, request.run_id, request.dispatch_id
        workdir = agent_workdir(runner.source_dir, str(agent.get("workdir") or "."), request)
        previous = sidecars.load(state, run_id, dispatch)
        sidecar = previous or sidecars.Sidecar()
        resume: dict[str, Any] = dict(agent.get("resume") or {})
        repo, worktree, cwd = None, None, workdir
        if agent.get("isolation") == "worktree":
            repo = worktrees.repo_root(workdir)
            if repo is None:
                raise AgentError(
                    f"step {request.step_id}: isolation: worktree needs a git repository, but "
                    f"{workdir} is not inside one; run `git init` there or use isolation: none",
                    executed=False,
                )
            worktree = Path(
                sidecar.worktree
                or resume.get("worktree")
                or worktrees.worktree_path(state, run_id, dispatch)
            )
            try:
                worktrees.ensure_worktree(repo, worktree)
            except worktrees.GitError as exc:
                raise AgentError(f"step {request.step_id}: {exc}", executed=False) from exc
            # Resolved again in the worktree as committed: HEAD may hold a symlink where the
            # checkout has a folder.
            cwd = worktrees.resolve_workdir(
                worktree, workdir.relative_to(repo), step_id=request.step_id
            )
        continues = agent.get("session") == "continue"
        prompt, resume_id, preset = request.prompt or "", None, None
        usage_base: tuple[int, ...] = (0, 0)
        if continues and previous is not None and previous.session_id:
            resume_id, usage_base = previous.session_id, tuple(previous.usage_total)  # reclaimed
        elif continues and resume.get("session_id"):
            resume_id = str(resume["session_id"])
            usage_base = tuple(resume.get("usage_total") or (0, 0))
        elif runner.adapter.presets_session:
            preset = sidecars.preset_session_id(dispatch, sidecar.launches + 1)
        if resume.get("session_id") and resume_id == resume.get("session_id"):
            prompt = str(agent.get("feedback") or "").strip() or prompt  # only the feedback
        home = (
            sidecars.isolated_home(state, run_id)
            if runner.home == "isolated"
            else Path(request.env.get("HOME") or os.path.expanduser("~"))
        )
        call = AgentCall(
            prompt=prompt,
            model=request.model,
            permission=agent.get("permission") or "edits",
            max_turns=agent.get("max_turns"),
            cwd=str(cwd),
            home=str(home),
            scratch=str(sidecars.scratch(state, run_id, dispatch)),
            session_id=preset,
            resume_id=resume_id,
            output_schema=request.output_schema,
            max_cost=agent.get("max_cost"),
        )
        sidecar.launches += 1
        sidecar.session_id = resume_id or preset
        sidecar.worktree = str(worktree) if worktree else None
        sidecar.usage_total = list(usage_base)
        sidecars.save(state, run_id, dispatch, sidecar)
        env = launch_env(runner.adapter, call, request, isolated=runner.home == "isolated")
        return cls(
            runner,
            request,
            call,
            repo=repo,
            worktree=worktree,
            sidecar=sidecar,
            usage_base=usage_base,
            env=env,
            reclaimed=previous is not None,
        )

    def execute(self) -> UnitResult:
        started = time.time()
        extra = self._open_bridge()
        try:
            return self._execute(extra)
        finally:
            if self.bridged is not None:
                self.bridged.close()  # the port closes with the attempt
            self._scrub_home(started)

    def _scrub_home(self, since: float) -> None:
        """Mask the run's secrets in what the CLI wrote to the run's isolated HOME (its
        session transcripts): nothing under the state dir keeps a secret at rest. A resumed
        session then reads ``***`` where its history held one."""
        redact = self.request.redact
        if self.runner.home != "isolated" or redact is None or not self.call.home:
            return
        sidecars.scrub_home(Path(self.call.home), redact, since=since)

    def _open_bridge(self) -> list[str]:
        """Open the attempt's bridge and point the CLI at it; the extra arguments it needs.
        A harness whose login cannot be bridged runs unbridged, with one warning."""
        runner, agent = self.runner, self.request.agent or {}
        chosen = agent.get("bridge")  # the step's bridge: wins over the runners: setting
        replay = replaying.attempt_replay(runner.cassette, self.request, runner.name)
        if not (runner.bridge if chosen is None else chosen) and replay is None:
            return []
        try:
            wire = wiring if replay is None else replay_wiring
            wired: Wiring = wire(
                runner.adapter.name, self.env, model=self.call.model, cwd=self.call.cwd
            )
        except NotBridgeable as exc:
            if replay is not None:
                raise AgentError(f"{runner.name}: cannot replay ({exc})", executed=False) from exc
            if not runner._bridge_warned:
                runner._bridge_warned = True
                self.bridge_note = f"{runner.name}: not bridged ({exc}); calls are not journaled"
            return []
        request = self.request
        bridged = BridgedAttempt(
            harness=runner.name,
            options=runner.options,
            identity={
                "run_id": request.run_id,
                "step_id": request.step_id,
                "unit_id": request.unit_id,
                "dispatch_id": request.dispatch_id,
                "attempt": request.attempt,
            },
            journal=agent.get("calls"),
            redact=self.redactor.redact,
            allowance=agent.get("allowance"),
            limits=agent.get("limits"),
            replay=replay,
            workdir=str(self.call.cwd),
            home=str(self.call.home) if self.call.home else None,
        )
        try:
            url = bridged.open(wired.upstream, model=request.model)
        except OSError as exc:
            raise AgentError(
                f"{runner.name}: the bridge could not listen on 127.0.0.1 ({exc}); "
                f"set runners: {{{runner.name}: {{bridge: false}}}} to run unbridged",
                executed=False,
            ) from exc
        self.bridged = bridged
        self.env.update(wired.env_for(url))
        return wired.argv_for(url)

    def _bridge_usage(self, outcome: Outcome) -> dict[str, Any] | None:
        """Set ``outcome``'s tokens and cost to the sums over its bridged calls; the CLI's
        own report and the sums, for the facts (None: not bridged)."""
        if self.bridged is None:
            return None
        totals = self.bridged.totals()
        if totals.calls == 0:
            return None  # nothing went through it (a CLI that made no call): its report stands
        reported = {
            "tokens_in": outcome.tokens_in,
            "tokens_out": outcome.tokens_out,
            "cost": outcome.cost,
            "cost_source": outcome.cost_source,
        }
        outcome.tokens_in, outcome.tokens_out = totals.tokens_in, totals.tokens_out
        outcome.cost = totals.cost
        sources = ", ".join(self.bridged.sources()) or "none"
        outcome.cost_source = f"bridge: sum of {totals.calls} call(s) (priced by {sources})"
        return {
            "calls": totals.calls,
            "tokens_in": totals.tokens_in,
            "tokens_out": totals.tokens_out,
            "cost": totals.cost,
            "cli_report": reported,
        }

    def _execute(self, extra: list[str]) -> UnitResult:
        runner, request = self.runner, self.request
        argv = [runner.bin, *runner.args, *extra, *runner.adapter.argv(self.call)]
        on_stdin = bool(getattr(runner.adapter, "prompt_on_stdin", False))
        deadline = None if request.timeout_s is None else time.monotonic() + request.timeout_s
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.call.cwd,
                env=self.env,
                stdin=subprocess.PIPE if on_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise AgentError(
                f"cannot start {runner.bin!r} ({exc.strerror}); install the {runner.name} CLI "
                f"or set runners: {{{runner.name}: {{bin: PATH}}}}",
                executed=False,
            ) from exc
        with runner._lock:
            runner._live[request.dispatch_id] = proc
        if on_stdin:
            _give_prompt(proc, self.call.prompt)
        try:
            record_unit_process(
                runner.state_dir,
                dispatch_id=request.dispatch_id,
                run_id=request.run_id,
                unit_id=request.unit_id,
                pid=proc.pid,
                argv0=runner.bin,
                kind="agent",
            )
        except (OSError, ValueError):
            pass  # a read-only state dir: only an orphan goes unrecorded
        watch = Watch(session_id=self.sidecar.session_id)
        reader = StreamReader(
            proc,
            adapter=runner.adapter,
            watch=watch,
            redactor=self.redactor,
            output_cap=runner.output_cap,
            log_path=sidecars.log_path(runner.state_dir, request.run_id, request.dispatch_id),
            on_session=self._journal_session,
            on_text=request.on_text,
        )
        try:
            code = reader.wait(deadline)
        except BaseException:
            _kill_group(proc)  # an interrupt must not leave the agent running
            raise
        with runner._lock:
            cancelled = request.dispatch_id in runner._cancelled
            runner._cancelled.discard(request.dispatch_id)
        if cancelled:
            reader.finish(1.0)
            spent = Outcome()
            facts = self._facts(spent, watch, code=code, error_class="stopped")
            raise AgentError(
                f"{runner.name} was stopped (the drive was stopped or interrupted) and its "
                "process group was killed; a later drive runs the unit again",
                transient=True,
                facts=facts,
                tokens_in=spent.tokens_in,
                tokens_out=spent.tokens_out,
                cost=spent.cost,
                price_source=self._price_source(spent),
            )
        if code is None:
            _kill_group(proc)
            reader.finish(1.0)
            spent = Outcome()
            facts = self._facts(spent, watch, code=None, error_class="timeout")
            raise AgentError(
                f"{runner.name} timed out after {request.timeout_s:g}s and its process group "
                "was killed",
                transient=True,
                facts=facts,
                tokens_in=spent.tokens_in,
                tokens_out=spent.tokens_out,
                cost=spent.cost,
                price_source=self._price_source(spent),
            )
        stdout = reader.stdout_text()
        events = list(reader.events) or parse_lines(stdout)  # one pretty-printed object
        try:
            outcome = runner.adapter.outcome(events, stdout, reader.err.text(), code, self.call)
        except Exception as exc:  # noqa: BLE001 - a CLI's odd output is its attempt's failure
            outcome = Outcome(
                failure=Failure(
                    error_class="failed",
                    message=f"its output could not be read ({type(exc).__name__}: {exc})"[:300],
                )
            )
        if outcome.failure is None and outcome.text is None and outcome.structured is None:
            seen = first_line(stdout) or first_line(reader.err.text()) or "nothing"
            outcome.failure = Failure(
                error_class="failed",
                message=f"exited with status {code} without a result (it printed: {seen})",
            )
        if outcome.failure is not None and reader.notes:  # say what was skipped, once
            failure = outcome.failure
            outcome.failure = Failure(
                error_class=failure.error_class, message=f"{failure.message} ({reader.notes[0]})"
            )
        self.notes = reader.notes
        self.leftover = reader.leftover
        return self._result(outcome, watch, code)

    def _journal_session(self, session_id: str) -> None:
        """Write a session id read from the stream to the sidecar at once (a file: worker
        threads never write the journal), so a driver killed now still has it."""
        self.sidecar.session_id = session_id
        sidecars.save(
            self.runner.state_dir, self.request.run_id, self.request.dispatch_id, self.sidecar
        )

    def _result(self, outcome: Outcome, watch: Watch, code: int) -> UnitResult:
        outcome.session_id = outcome.session_id or watch.session_id or self.sidecar.session_id
        total = (outcome.tokens_in, outcome.tokens_out)
        if outcome.usage_cumulative and self.call.resume_id:
            outcome.tokens_in = max(0, total[0] - self.usage_base[0])
            outcome.tokens_out = max(0, total[1] - self.usage_base[1])
        if not outcome.usage_cumulative:
            total = (self.usage_base[0] + total[0], self.usage_base[1] + total[1])
        self.sidecar.session_id = outcome.session_id
        self.sidecar.usage_total = list(total)
        sidecars.save(
            self.runner.state_dir, self.request.run_id, self.request.dispatch_id, self.sidecar
        )
        refusal = self.bridged.refusal if self.bridged is not None else None
        if refusal is not None:  # the bridge refused a call: the agent stopped on the budget
            outcome.failure = Failure(error_class="budget", message=refusal)
        elif self.bridged is not None and self.bridged.replay is not None:
            replaying.check(self.bridged.replay, outcome)
        failure = outcome.failure
        facts = self._facts(
            outcome, watch, code=code, error_class=failure.error_class if failure else None
        )
        facts["usage_total"] = list(total)
        if outcome.warnings:
            said = [f"{self.runner.name}: {w}" for w in outcome.warnings]
            facts["warnings"] = [*facts.get("warnings", []), *said]
        if self.notes:
            facts["stream_notes"] = list(self.notes)
        if self.leftover:
            facts["leftover_group"] = f"processes left in its group were ended ({self.leftover})"
        tokens_in, tokens_out = self._tokens(outcome)
        if failure is not None and refusal is not None:
            raise AgentError(
                refusal,
                facts=facts,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=outcome.cost,
                price_source=self._price_source(outcome),
                budget_stop=refusal,
            )
        if failure is not None:
            raise AgentError(
                f"{self.runner.name} failed ({failure.error_class}): {failure.message}",
                transient=failure.transient,
                facts=facts,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost=outcome.cost,  # a failed run still spent (Claude's max_turns, denials)
                price_source=self._price_source(outcome),
            )
        return UnitResult(
            output=unit_output(outcome, self.request.output_schema, strip_code_fence),
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            model=self.request.model,
            cost=outcome.cost,
            price_source=self._price_source(outcome),
            session_id=outcome.session_id,
            facts=facts,
        )

    def _tokens(self, outcome: Outcome) -> tuple[int | None, int | None]:
        """The attempt's (tokens in, out); a direction whose reported count was refused is
        unknown (None) unless bridged calls counted the tokens instead."""
        if (outcome.cost_source or "").startswith("bridge:"):
            return outcome.tokens_in, outcome.tokens_out
        refused = [w for w in outcome.warnings if isinstance(w, usage.TokenWarning)]
        return (
            None if any(not w.is_output for w in refused) else outcome.tokens_in,
            None if any(w.is_output for w in refused) else outcome.tokens_out,
        )

    def _price_source(self, outcome: Outcome) -> str | None:
        """The bridge's price source when the cost is the sum of its calls (else the
        runner's: None)."""
        bridged = self.bridged is not None and (outcome.cost_source or "").startswith("bridge:")
        return outcome.cost_source if bridged and outcome.cost is not None else None

    def _facts(
        self, outcome: Outcome, watch: Watch, *, code: int | None, error_class: str | None
    ) -> dict[str, Any]:
        worktree = None
        if self.worktree is not None and self.repo is not None:
            worktree = worktrees.settle(self.repo, self.worktree)
        facts = attempt_facts(
            harness=self.runner.name,
            version=self.runner.version(env=self.env, cwd=self.call.cwd),
            call=self.call,
            outcome=outcome,
            watch=watch,
            exit_code=code,
            error_class=error_class,
            worktree=worktree,
            reclaimed=self.reclaimed,
            redactor=self.redactor,
        )
        bridge = self._bridge_usage(outcome)  # after the facts: they keep the CLI's report
        if bridge is not None:
            facts["bridge"] = bridge
        if self.bridge_note:
            facts["bridge_off"] = self.bridge_note
        if self.bridged is not None and self.bridged.replay is not None:
            facts.update(replaying.facts(self.bridged.replay))
        return facts


def _give_prompt(proc: subprocess.Popen[bytes], prompt: str) -> None:
    """Write ``prompt`` to the CLI's stdin and close it, from a daemon thread (a CLI that
    never reads it must not block the attempt; one that exits early ends the write)."""

    def write() -> None:
        assert proc.stdin is not None  # PIPE was requested
        try:
            with proc.stdin:
                proc.stdin.write(prompt.encode("utf-8", errors="replace"))
        except (OSError, ValueError):
            pass  # it exited or closed stdin: its exit status tells the rest

    threading.Thread(target=write, daemon=True).start()
