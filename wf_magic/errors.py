"""The one error tree of wf_magic: every failure a user can see is a ``WorkflowError``.

::

    WorkflowError (Exception)
    ├── DefinitionError (ValueError)     a workflow source is wrong: line + field
    ├── UsageError (ValueError)          a call or command line is wrong
    │   ├── StateDirReplaced             the state dir went away under an open run
    │   ├── FileRefused                  a named file is special, too large or unreadable
    │   └── StateDirReadOnly             the state dir cannot be written (a verb that writes)
    ├── PlanIntegrityError               a stored plan or params were edited
    │   └── PlanVersionError             a plan from a newer/older plan_version
    │       └── PlanVersionTooNew        a newer wf_magic froze it: left untouched (CLI exit 2)
    │   └── RunNotOwned                  another user's run, read-only until adopted
    ├── RunLockHeld                      another driver holds the run (CLI exit 75)
    ├── RunAbandoned                     the run was given up: nothing to resume or abandon
    ├── BudgetExceeded                   a ceiling would be passed
    ├── GateDecisionRefused              a human decision matched nothing waiting
    ├── RunnerError                      a unit's runner failed (transient or permanent)
    ├── MigrationError                   the state database ledger is not ours
    └── StateDBError                     the state database failed: full, locked, damaged

Messages say what happened, to which run/step/unit, and what the user can do next.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Iterable
from typing import Literal

MAX_RETRY_AFTER_S = 600.0
"""The longest provider-requested wait (``RunnerError.retry_after_s``) a retry honours."""


class WorkflowError(Exception):
    """Base class of every error wf_magic raises on purpose."""

    def __init__(self, message: str, *, run_id: str | None = None, step_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.step_id = step_id

    def __str__(self) -> str:
        return self.message


class DefinitionError(WorkflowError, ValueError):
    """A workflow definition is invalid; names the source line and the field."""

    def __init__(
        self,
        problem: str,
        *,
        field: str | None = None,
        line: int | None = None,
        source_name: str | None = None,
    ):
        problem = " ".join(problem.split())  # one line, whatever the YAML parser said
        self.problem = problem
        self.field = field
        self.line = line
        self.source_name = source_name
        where = []
        if source_name:
            where.append(source_name)
        if line is not None:
            where.append(f"line {line}")
        head = f"{field}: " if field else ""
        tail = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{head}{problem}{tail}")


class UsageError(WorkflowError, ValueError):
    """A command line, API call or param value is wrong."""


class StateDirReplaced(UsageError):
    """The state dir was deleted or replaced while a run in it was open (its journal is gone)."""


FileRefusal = Literal["missing", "os", "special", "too_large"]
"""Why a file was not read:

- ``missing``: it does not exist.
- ``os``: the operating system refused it (``errno`` says how: permissions, a loop of links).
- ``special``: it is a directory, FIFO, device or socket, not a regular file.
- ``too_large``: it holds more bytes than the reader's bound.
"""


class FileRefused(UsageError):
    """A file was not read (``wf_magic.reading.read_bounded``); the message names the path.

    Readers turn it into their own error (a definition error for a workflow file, a library
    or runner error for an index or a cassette), quoting ``problem``.
    """

    def __init__(self, path: str, problem: str, *, reason: FileRefusal, errno: int | None = None):
        self.path = path
        self.problem = problem
        self.reason = reason
        self.errno = errno
        super().__init__(f"{path}: {problem}")


class StateDirReadOnly(UsageError):
    """The state dir (or its database file) cannot be written, and the verb must write.

    Verbs that only read (``status``, ``list``, ``journal``, ...) work on a read-only state dir;
    this names the directory and why it cannot be written, never a damaged database.
    """

    def __init__(self, state_dir: str, *, reason: str, run_id: str | None = None):
        self.state_dir = state_dir
        self.reason = reason
        head = f"Run {run_id}: " if run_id else ""
        super().__init__(
            f"{head}the state dir {state_dir} is read-only ({reason}); this needs to write to "
            "it. Make it writable, or point --db / WF_MAGIC_HOME at a writable directory "
            "(verbs that only read, such as `wf status` and `wf list`, work as they are).",
            run_id=run_id,
        )

    @classmethod
    def from_os_error(
        cls, state_dir: str, exc: OSError, *, run_id: str | None = None
    ) -> StateDirReadOnly | None:
        """The error for ``exc`` when it says the state dir cannot be written, else None."""
        if exc.errno not in READ_ONLY_ERRNOS:
            return None
        return cls(state_dir, reason=str(exc.strerror or exc), run_id=run_id)


READ_ONLY_ERRNOS = frozenset({_errno.EROFS, _errno.EACCES, _errno.EPERM})
"""What the OS says when a file cannot be written: a read-only filesystem, permissions, an
immutable attribute (``chattr +i``)."""


class RunNotOwned(UsageError):
    """Another user's run: read-only until adopted (``wf adopt RUN``); nothing was changed."""

    def __init__(self, run_id: str, *, owner: str, user: str, verb: str):
        self.owner = owner
        self.user = user
        self.verb = verb
        super().__init__(self.text(adopt=f"wf adopt {run_id}", run_id=run_id), run_id=run_id)

    def text(self, *, adopt: str, run_id: str | None = None) -> str:
        """The message, naming ``adopt`` as the command that makes the run yours
        (``%workflow adopt RUN`` in a notebook)."""
        rid = run_id or self.run_id
        return (
            f"Run {rid} belongs to {self.owner}; another user's run is read-only, so "
            f"{self.user} may not {self.verb} it (nothing was changed). `{adopt}` makes it "
            "yours first."
        )


class PlanIntegrityError(WorkflowError):
    """A run's stored plan or params do not match their recorded hash."""


class PlanVersionError(PlanIntegrityError):
    """A run's plan was written by another plan_version than this one can drive."""


class PlanVersionTooNew(PlanVersionError):
    """A newer wf_magic froze the run's plan: it is left untouched until an upgrade."""


class RunLockHeld(WorkflowError):
    """Another driver (process or thread) is driving this run."""

    def __init__(
        self,
        run_id: str,
        *,
        pid: int | None,
        since: str | None,
        host: str | None = None,
        user: str | None = None,
    ):
        self.pid = pid
        self.since = since
        self.host = host
        self.user = user
        who = f"pid {pid}" if pid is not None else "another driver"
        if host:
            who += f" on {host}"
        if user:
            who += f" (user {user})"
        when = f" since {since}" if since else ""
        self.holder = f"{who}{when}"
        """Who holds the run: ``pid 4242 on HOST since 10:31:02`` (or ``another driver``)."""
        super().__init__(
            f"Run {run_id} is being driven by {who}{when}; wait for it or stop that process "
            f"(`wf stop {run_id}`).",
            run_id=run_id,
        )


class LeaseLost(WorkflowError):
    """This driver's lease on the run expired or was taken over: it stopped, writing nothing.

    A driver paused or cut off past its lease (``WF_MAGIC_LEASE_TTL``) finds, at its next
    journal write, that another driver may own the run now; the write rolls back whole.
    """

    def __init__(self, run_id: str):
        super().__init__(
            f"Run {run_id}: this driver lost its lease on the run (paused, cut off or slower "
            "than WF_MAGIC_LEASE_TTL); it stopped and wrote nothing more. Another driver may "
            f"hold it now: `wf status {run_id}` shows it; `wf resume {run_id}` continues it "
            "once that lease ends.",
            run_id=run_id,
        )


class RunAbandoned(WorkflowError):
    """The run was abandoned: it cannot be resumed or abandoned again (start anew or fork)."""

    def __init__(self, run_id: str, *, reason: str | None, verb: str):
        self.reason = reason
        why = f" (reason: {reason})" if reason else ""
        if verb == "abandon":
            head = f"Run {run_id} is already abandoned{why}; nothing was changed."
        else:
            head = f"Run {run_id} was abandoned{why} and cannot be resumed."
        super().__init__(
            f"{head} Start a new run with `wf run FILE --new`, or `wf fork {run_id} "
            "--from STEP` to reuse its results.",
            run_id=run_id,
        )


class BudgetExceeded(WorkflowError):
    """A unit was not dispatched because it would pass a run budget ceiling."""

    def __init__(
        self,
        *,
        run_id: str,
        step_id: str | None,
        unit_id: str | None,
        ceiling: str,
        used: float,
        limit: float,
    ):
        self.ceiling = ceiling
        self.used = used
        self.limit = limit
        self.unit_id = unit_id
        super().__init__(
            f"Budget exceeded in run {run_id}: {ceiling} used {_num(used)} of {_num(limit)}; "
            f"unit {unit_id} was not dispatched. Raise budget.{ceiling} and start a new run "
            f"(--new), or fork this one.",
            run_id=run_id,
            step_id=step_id,
        )


class GateDecisionRefused(WorkflowError):
    """A human approve/reject did not match what the run is waiting for."""


class RunnerError(WorkflowError):
    """A runner could not produce a result; ``transient`` errors may be retried."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        tokens_in: int | None = 0,
        tokens_out: int | None = 0,
        executed: bool = True,
        detail: str | None = None,
        retry_after_s: float | None = None,
        cost: float | None = None,
        price_source: str | None = None,
        throttled: bool = False,
    ):
        super().__init__(message)
        self.transient = transient or throttled
        self.throttled = throttled
        """The provider's rate limiter refused the call (429, 529, overloaded): nothing was
        served, so the drive waits (``retry_after_s``, the endpoint's limiter) and sends the
        same attempt again — no new attempt row, no unit charged, no ``retry:`` spent."""
        self.retry_after_s = retry_after_s
        """How long the provider asked to wait before a retry (a transient error's next
        dispatch waits at least this, and at most ``MAX_RETRY_AFTER_S``)."""
        self.executed = executed
        """False when nothing ran (unknown target, program not found): a run-level retry
        would fail the same way, so ``max_retries`` does not re-open for it."""
        self.detail = detail
        """More than the one-line message, kept with the failed attempt: a python step's
        traceback (its own frames), shown by ``wf show`` and the unit panel."""
        self.tokens_in = tokens_in
        self.tokens_out = tokens_out
        """What the failed attempt used, as reported; None: the server reported no count."""
        self.cost = cost
        """Dollars the failed attempt still cost, when the runner knows (a Claude run that
        hit ``max_turns`` reports its spend): journaled with the attempt and charged."""
        self.price_source = price_source
        """Where ``cost`` came from (default ``runner``, as for a result's own cost)."""


class MigrationError(WorkflowError):
    """The state database's migration ledger diverges from this version's registry."""


StateDBFault = Literal["full", "busy", "readonly", "io", "damaged", "unreadable", "unreachable"]
"""What went wrong with the state database:

- ``full``: the disk (or the database's page limit) is full.
- ``busy``: another process held the write lock past the busy timeout.
- ``readonly``: the file or its filesystem cannot be written.
- ``io``: the operating system reported an I/O error.
- ``damaged``: SQLite found corrupted pages (``integrity`` says what ``integrity_check`` saw).
- ``unreadable``: a row was edited by hand into something wf_magic cannot read.
"""

_STATE_DB_ADVICE: dict[str, str] = {
    "full": "Free disk space, then {retry}.",
    "busy": "Wait for the other process that writes it, then {retry}.",
    "readonly": "Make it writable (or point --db / WF_MAGIC_HOME elsewhere), then {retry}.",
    "io": "Check the disk, then {retry}.",
    "damaged": (
        "Restore it from a backup or rebuild it with `sqlite3 {db} .recover`; "
        "or point --db / WF_MAGIC_HOME at a fresh directory."
    ),
    "unreadable": "Restore the row from a backup, or start afresh with `wf run FILE --new`.",
    "unreachable": "Check that the PostgreSQL server is up and reachable, then {retry}.",
}


class StateDBError(WorkflowError):
    """The state database failed under a read or a write; nothing was half-written.

    A failed write rolls back whole, so the run stays as it was before it (resumable).
    """

    def __init__(
        self,
        fault: StateDBFault,
        *,
        detail: str,
        db_path: str,
        run_id: str | None = None,
        integrity: str | None = None,
    ):
        self.fault = fault
        self.detail = detail
        self.db_path = db_path
        self.integrity = integrity
        head = f"Run {run_id}: " if run_id else ""
        what = f"{detail}; integrity_check: {integrity}" if integrity else detail
        retry = f"`wf resume {run_id}`" if run_id else "retry"
        done = (
            " Nothing was half-written." if fault in ("full", "busy", "io", "unreachable") else ""
        )
        advice = _STATE_DB_ADVICE[fault].format(retry=retry, db=db_path)
        super().__init__(
            " ".join(f"{head}state database {db_path}: {what}.{done} {advice}".split()),
            run_id=run_id,
        )

    def for_run(self, run_id: str) -> StateDBError:
        """The same failure, naming the run it happened to (the drive's boundary adds it)."""
        if self.run_id is not None:
            return self
        return StateDBError(
            self.fault,
            detail=self.detail,
            db_path=self.db_path,
            run_id=run_id,
            integrity=self.integrity,
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}"


def clip(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters with "…" when longer.

    For echoing values in messages: a message stays one readable line whatever the input.
    """
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: max(limit - 1, 0)] + "…"


MAX_MESSAGE_CHARS = 2000
"""The faces print no error message longer than this (:func:`clip_message`)."""


def count_text(count: int) -> str:
    """``99990`` → ``"99 990"``: digits grouped by threes with a space."""
    return f"{count:,}".replace(",", " ")


def clip_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line and at most ``limit`` characters, saying how many were left out.

    ``"… (and 12 345 more characters)"`` ends a clipped message, so a reader knows there was
    more (``--debug`` shows it whole).
    """
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    tail_room = len(" … (and 9 999 999 999 more characters)")
    kept = line[: max(limit - tail_room, 0)].rstrip()
    return f"{kept} … (and {count_text(len(line) - len(kept))} more characters)"


def clip_list(items: Iterable[object], limit: int = 10, *, each: int = 60) -> str:
    """``repr`` of the first ``limit`` items joined by ", ", then ``… (and N more)``.

    Each item is clipped to ``each`` characters: a list of 100 000 names, or of one giant
    name, stays a short line.
    """
    shown: list[str] = []
    more = 0
    for item in items:
        if len(shown) < limit:
            shown.append(clip(repr(item), each))
        else:
            more += 1
    tail = f", … (and {count_text(more)} more)" if more else ""
    return ", ".join(shown) + tail


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored or printed as UTF-8, or None when it can.

    A command-line argument that is not UTF-8 reaches Python as lone surrogates
    (``surrogateescape``: byte 0xff is U+DCFF); the byte is named, and the fix.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        what = (
            f"byte 0x{char - 0xDC00:02x}"  # how Python decodes a byte that is not UTF-8
            if 0xDC80 <= char <= 0xDCFF
            else f"a lone surrogate U+{char:04X}"
        )
        return f"not valid UTF-8 text ({what} at character {exc.start}); pass it as UTF-8"
    return None


def unexpected_text(exc: BaseException, *, command: str) -> str:
    """One line about an exception no layer translated: its class, its input, what next.

    Never blames the state database (the ``wf`` command says that only for SQLite's own
    faults): a ``MemoryError`` says the input was too large, a ``UnicodeError`` shows the
    text it could not encode or decode, anything else names its class and message.
    """
    detail = clip(str(exc), 300)
    name = type(exc).__name__
    if isinstance(exc, MemoryError):
        what = f"ran out of memory ({name}{': ' + detail if detail else ''}); its input is too "
        what += "large for this machine: give it less (fewer params, smaller files)"
    elif isinstance(exc, UnicodeError):
        what = f"met text it cannot handle as UTF-8 ({name}: {_unicode_text(exc) or detail})"
    else:
        what = f"failed with {name}: {detail or 'no message'}"
    return (
        f"`{clip(command, 200)}` {what}. This is not a fault of the state database; "
        "`--debug` shows the traceback (please report it if the input is valid)."
    )


def _unicode_text(exc: UnicodeError) -> str:
    """What a Unicode error choked on: the characters or bytes, and where."""
    obj = getattr(exc, "object", None)
    start, end = getattr(exc, "start", None), getattr(exc, "end", None)
    if not isinstance(obj, str | bytes) or not isinstance(start, int) or not isinstance(end, int):
        return ""
    bad = ascii(obj[start:end])
    context = ascii(obj[max(start - 20, 0) : end + 20])
    verb = "cannot encode" if isinstance(obj, str) else "cannot decode"
    reason = getattr(exc, "reason", "")
    return f"{verb} {clip(bad, 40)} ({reason}) at position {start} of {clip(context, 120)}"


COUNT_MAX = 2**63 - 1
"""The largest count any argument takes: what an SQLite or PostgreSQL integer holds."""
CONCURRENCY_MAX = 10_000
"""The most units in flight a drive takes (``--max-concurrency``, ``max_concurrency=``)."""


def check_counts(**checks: tuple[object, int] | tuple[object, int, int]) -> None:
    """Refuse a count that is no integer (``2.5``, ``nan``, ``True``) or is out of its range
    (``max_concurrency=0``; ``(value, low)`` or ``(value, low, high)``), naming it: a Python
    caller's error, said as the CLI says it.

    Raises:
        UsageError: the first count that is wrong.
    """
    import numbers

    for name, (value, low, *rest) in checks.items():
        high = rest[0] if rest else COUNT_MAX
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise UsageError(f"{name} must be an integer >= {low} (got {value!r})")
        value = int(value)  # a numpy integer too
        if value < low:
            raise UsageError(f"{name} must be >= {low} (got {value})")
        if value > high:
            raise UsageError(f"{name} must be <= {high} (got {value})")


def check_mapping(value: object, *, what: str) -> None:
    """Refuse ``value`` unless it is None or a mapping (``params=[1]``), naming ``what``.

    Raises:
        UsageError: ``value`` is no mapping.
    """
    from collections.abc import Mapping

    if value is not None and not isinstance(value, Mapping):
        raise UsageError(
            f"{what}: expected a mapping of names to values, such as {{'topic': 'x'}} "
            f"(got {type(value).__name__})"
        )
