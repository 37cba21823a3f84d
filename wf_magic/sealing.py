"""Secret params at rest: stored as a keyed hash under the state dir's own key, never the value.

A param is secret when its name says so (:func:`wf_magic.redact.is_secret_key`: ``api_key``,
``db_password``, ``gh_token``), at any depth of the params, the same rule that masks it for
display. Before a run's row is written, each secret value is replaced by its *seal*:

    wf-sealed:hmac-sha256:<key id>:<HMAC-SHA256 of the value's canonical JSON>

keyed by 32 random bytes in ``<state dir>/secret.key`` (created on first need, mode 0600).
Why a keyed hash and not a plain one or a mask: a plain sha256 of a short password in a copied
``state.db`` can be guessed offline and matched across databases, and a mask (``***``) would
put every secret value in one scope and could not tell a resumed run's value from another.
The seal is deterministic under one key, so the same secret keeps its scope (re-running a cell
resumes its run) and a value handed to a resumed run can be checked against the one the run
started with. The key lives beside the database, not in it: the database, its WAL, a backup
or an exported frame carry nothing a secret can be read or guessed from without the key.

The value itself is never stored, so a drive needs it from its caller (see
:func:`unseal`); ``key id`` (a hash of the key) tells a replaced key file apart.

The same key closes the other way a secret could be read back: the hash journaled beside a
redacted input. A plain sha256 of a unit's input that holds an 8-character password, next to
the input with the password masked, is a dictionary oracle: hash each candidate until one
matches. :class:`InputHasher` is the one way a drive hashes what it journals (a unit's
input, a judge's input, a loop's context): what holds nothing the journal masks keeps its
plain sha256 (shared by every state, so cassettes replay anywhere); what holds a secret is
hashed with HMAC-SHA256 under a key derived from this one, so the hash is stable within the
state (reuse, resume and replay keep working) and tells nothing without the key.

A team sharing runs shares one key: ``$WF_MAGIC_SECRET_KEY_FILE`` names a key file of the same
format (32 bytes), used instead of ``<state dir>/secret.key`` by every state dir. It is read,
never created or stored in the database; a missing, short or unreadable file is an error
naming the variable.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FileRefused, StateDirReadOnly, UsageError
from .hashing import canonical_json, sha256_text
from .reading import file_kind, read_bounded
from .redact import Redactor, is_secret_key

KEY_FILENAME = "secret.key"
KEY_BYTES = 32
KEY_FILE_ENV = "WF_MAGIC_SECRET_KEY_FILE"
"""Names a shared key file used instead of each state dir's own ``secret.key``."""
SEAL_PREFIX = "wf-sealed:hmac-sha256:"
INPUT_HASH_LABEL = b"wf_magic input hash v1"
"""Derives the input-hash key from the sealing key, so an input hash is never a seal."""
ENV_PREFIX = "WF_PARAM_"
"""A secret param may come from the environment: ``api_token`` from ``WF_PARAM_API_TOKEN``."""


def env_name(param: str) -> str:
    """The environment variable a secret param may be read from (``WF_PARAM_API_TOKEN``)."""
    return ENV_PREFIX + "".join(c if c.isalnum() else "_" for c in param).upper()


def is_seal(value: Any) -> bool:
    """Whether ``value`` is a seal (a stored secret param)."""
    return isinstance(value, str) and value.startswith(SEAL_PREFIX)


@dataclass(frozen=True, slots=True)
class Sealed:
    """Params with their secret values sealed, and what each seal stands for."""

    params: dict[str, Any]
    vault: dict[str, Any] = field(repr=False)
    """Seal → the secret value (kept in memory only, for the drive)."""


class Sealer:
    """Seals secret values with HMAC-SHA256 under one state dir's key.

    Args:
        key: the key bytes (see :meth:`ensure` and :meth:`existing`).
    """

    __slots__ = ("_input_key", "_key", "key_id")

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.key_id = hashlib.sha256(key).hexdigest()[:12]
        """Names the key in every seal, so a replaced key file is told apart from a new value."""
        self._input_key = hmac.new(key, INPUT_HASH_LABEL, hashlib.sha256).digest()

    @classmethod
    def ensure(cls, state_dir: str | Path) -> Sealer:
        """The sealer of ``state_dir``, its key file created (0600) when missing.

        Raises:
            UsageError: the key file is unreadable or not a key, or cannot be created; or
                ``$WF_MAGIC_SECRET_KEY_FILE`` names no usable key file (it is never created).
        """
        shared = shared_key_path()
        if shared is not None:
            return cls._shared(shared)
        path = Path(state_dir) / KEY_FILENAME
        if not path.exists():
            try:
                _create_key(path)
            except OSError as exc:
                raise _unusable(path, exc) from None
        sealer = cls.existing(state_dir)
        if sealer is None:  # deleted the moment it was made
            raise _unusable(path, FileNotFoundError("deleted while being created"))
        return sealer

    @classmethod
    def existing(cls, state_dir: str | Path) -> Sealer | None:
        """The sealer of ``state_dir``; None when it has no key file.

        Raises:
            UsageError: the key file is unreadable or not a key; or
                ``$WF_MAGIC_SECRET_KEY_FILE`` names no usable key file.
        """
        shared = shared_key_path()
        if shared is not None:
            return cls._shared(shared)
        path = Path(state_dir) / KEY_FILENAME
        try:
            key = read_bounded(path, limit=KEY_BYTES)
        except FileRefused as exc:
            if exc.reason == "missing":
                return None
            if exc.reason == "os":
                raise _unusable(path, OSError(exc.errno, exc.problem)) from None
            key = b""  # a FIFO, a device or a larger file: not a key either
        if len(key) != KEY_BYTES:
            raise UsageError(
                f"{path} is not a secret key file (expected a regular file of {KEY_BYTES} "
                f"bytes, got {_size_text(path)}); move it aside: runs sealed with it cannot be "
                "resumed, new runs get a new key"
            )
        return cls(key)

    @classmethod
    def _shared(cls, path: Path) -> Sealer:
        """The sealer of the key file ``$WF_MAGIC_SECRET_KEY_FILE`` names (read, never made)."""
        try:
            key = read_bounded(path, limit=KEY_BYTES)
        except FileRefused as exc:
            problem = {
                "missing": "does not exist",
                "os": f"cannot be read ({exc.problem})",
                "special": "is not a regular file",
                "too_large": f"holds more than {KEY_BYTES} bytes",
            }[exc.reason]
            raise _shared_unusable(path, problem) from None
        if len(key) != KEY_BYTES:
            raise _shared_unusable(path, f"holds {len(key)} bytes")
        return cls(key)

    def seal(self, value: Any) -> str:
        """The seal of a secret value (any JSON value)."""
        digest = hmac.new(self._key, canonical_json(value).encode("utf-8"), hashlib.sha256)
        return f"{SEAL_PREFIX}{self.key_id}:{digest.hexdigest()}"

    def input_digest(self, text: str) -> str:
        """The keyed hash of an input that holds a secret: 64 hex digits like a sha256."""
        return hmac.new(self._input_key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def seal_params(self, params: Mapping[str, Any], *, whole: Collection[str] = ()) -> Sealed:
        """``params`` with every value under a secret-looking name (at any depth) sealed.

        ``whole``: params sealed as one value whatever their name: a child's param that
        carries its parent's secret under a plain name (``text: "Bearer {{ params.token }}"``).
        """
        vault: dict[str, Any] = {}

        def walk(value: Any, *, secret: bool) -> Any:
            if secret:
                sealed = self.seal(value)
                vault[sealed] = value
                return sealed
            if isinstance(value, dict):
                return {k: walk(v, secret=is_secret_key(str(k))) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, secret=False) for v in value]
            return value

        sealed = {k: walk(v, secret=k in whole or is_secret_key(str(k))) for k, v in params.items()}
        return Sealed(params=sealed, vault=vault)


@dataclass(frozen=True, slots=True)
class InputHash:
    """A value hashed for the journal: its hash, the hash an older wf_magic gave it, its copy."""

    hash: str
    """What is journaled and looked up: the plain sha256 of ``text``, or its keyed hash when
    the value holds something the journal masks (see :class:`InputHasher`)."""
    legacy: str | None
    """The plain sha256 of ``text`` when ``hash`` is keyed, else None: what a wf_magic before
    the keyed hash journaled for the same value, so its attempts are still found."""
    text: str
    """The value's canonical JSON, unredacted (what is hashed; never journaled)."""
    kept_json: str
    """The value's canonical JSON as the journal keeps it: redacted."""

    @property
    def hashes(self) -> tuple[str, ...]:
        """Every hash an attempt of this value may be journaled under: ``hash``, ``legacy``."""
        return (self.hash,) if self.legacy is None else (self.hash, self.legacy)


class InputHasher:
    """The one way a drive hashes a value it journals redacted (a unit's, a judge's input).

    A value the run's redactor leaves alone keeps its plain sha256, as every wf_magic
    computed it: a cassette of it replays in any state. A value the redactor would mask (a
    secret param's value, an environment secret, a credential shape) is hashed with
    HMAC-SHA256 under the state's key (:meth:`Sealer.input_digest`): the hash journaled
    beside its masked copy can no longer be matched against guessed secrets, and stays equal
    for equal inputs within the state (and every state sharing ``$WF_MAGIC_SECRET_KEY_FILE``).

    Args:
        redactor: the run's redactor (what the journal masks); None hashes everything
            plainly, for units rendered outside a drive.
        state_dir: the state dir whose key is used (created on first need, mode 0600).
    """

    __slots__ = ("_lock", "_sealer", "_state_dir", "redactor")

    def __init__(self, redactor: Redactor | None, *, state_dir: str | Path | None) -> None:
        self.redactor = redactor
        self._state_dir = state_dir
        self._sealer: Sealer | None = None
        self._lock = threading.Lock()

    @classmethod
    def plain(cls) -> InputHasher:
        """A hasher that treats nothing as secret (every hash the plain sha256)."""
        return cls(None, state_dir=None)

    def hash_value(self, value: Any) -> InputHash:
        """``value`` (JSON-like) hashed over its canonical JSON, with its journaled copy.

        Raises:
            UsageError: the value holds a secret and the state's key file is unusable.
        """
        text = canonical_json(value)
        kept = value if self.redactor is None else self.redactor.redact_value(value)
        if kept is value:
            return InputHash(hash=sha256_text(text), legacy=None, text=text, kept_json=text)
        return self._keyed(text, canonical_json(kept))

    def hash_text(self, text: str) -> InputHash:
        """A text (not a JSON value: a loop's context) hashed like :meth:`hash_value`.

        Raises:
            UsageError: the text holds a secret and the state's key file is unusable.
        """
        kept = text if self.redactor is None else self.redactor.redact(text)
        if kept is text:
            return InputHash(hash=sha256_text(text), legacy=None, text=text, kept_json=text)
        return self._keyed(text, kept)

    def _keyed(self, text: str, kept_json: str) -> InputHash:
        with self._lock:
            if self._sealer is None:
                if self._state_dir is None:
                    raise ValueError("a hasher that keys secret inputs needs a state dir")
                self._sealer = Sealer.ensure(self._state_dir)
            sealer = self._sealer
        return InputHash(
            hash=sealer.input_digest(text), legacy=sha256_text(text), text=text, kept_json=kept_json
        )


_WORD = re.compile(r"[^\s\"'`=:,;()<>\[\]{}]+")
"""A word of a person's text that could be a pasted secret value: no spaces or separators."""


def sealed_words(text: str, params: Mapping[str, Any], state_dir: str | Path) -> list[str]:
    """The words of ``text`` that are the value of one of the run's secret params.

    A secret's value is never stored, but its seal is: a word whose seal is among the
    params' seals (``api_key=<the value>`` in a person's feedback) is that secret, found in
    any process that has the state dir's key. Empty when the run has no secret params.
    """
    seals = {seal for name, value in params.items() for seal in seals_of(value, name=name)}
    sealer = Sealer.existing(state_dir) if seals else None
    if sealer is None:
        return []
    return sorted({w for w in _WORD.findall(text) if sealer.seal(w) in seals})


def has_secrets(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` hold a value under a secret-looking name, at any depth."""
    return any(_holds_secret(v, secret=is_secret_key(str(n))) for n, v in params.items())


def seals_of(value: Any, *, name: str) -> list[str]:
    """The seals stored in the param ``name`` with value ``value`` (a param sealed whole
    counts whatever its name)."""
    return _seals(value, secret=is_seal(value) or is_secret_key(name))


def unseal(params: Mapping[str, Any], vault: Mapping[str, Any], *, run_id: str) -> dict[str, Any]:
    """``params`` with each seal (under a secret-looking name, or a param sealed whole)
    replaced by its value.

    Params without seals come back as they are (the same dict's contents).

    Raises:
        UsageError: a seal's value was not handed to this drive.
    """

    def walk(value: Any, *, secret: bool, name: str) -> Any:
        if secret and is_seal(value):
            if value not in vault:
                raise missing_secret(run_id, name)
            return vault[value]
        if isinstance(value, dict):
            return {k: walk(v, secret=is_secret_key(str(k)), name=name) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, secret=False, name=name) for v in value]
        return value

    return {
        k: walk(v, secret=is_seal(v) or is_secret_key(str(k)), name=k) for k, v in params.items()
    }


def missing_secret(run_id: str, name: str) -> UsageError:
    """The error for a resumed run whose secret param ``name`` was not handed back."""
    return UsageError(
        f"Run {run_id} has the secret param {name!r}, whose value is never stored; pass it "
        f"again to drive the run: `--param {name}=VALUE`, params={{{name!r}: ...}} in "
        f"Python, or the environment variable {env_name(name)}",
        run_id=run_id,
    )


def _holds_secret(value: Any, *, secret: bool) -> bool:
    if secret:
        return True
    if isinstance(value, dict):
        return any(_holds_secret(v, secret=is_secret_key(str(k))) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_secret(v, secret=False) for v in value)
    return False


def _seals(value: Any, *, secret: bool) -> list[str]:
    if secret:
        return [value] if is_seal(value) else []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _seals(v, secret=is_secret_key(str(k)))]
    if isinstance(value, list):
        return [s for v in value for s in _seals(v, secret=False)]
    return []


def shared_key_path() -> Path | None:
    """The shared key file ``$WF_MAGIC_SECRET_KEY_FILE`` names (None when unset or blank)."""
    name = os.environ.get(KEY_FILE_ENV, "").strip()
    return Path(name).expanduser() if name else None


def _shared_unusable(path: Path, problem: str) -> UsageError:
    return UsageError(
        f"{KEY_FILE_ENV}={path}: the file {problem}; expected a regular file of {KEY_BYTES} "
        "bytes (the format of <state dir>/secret.key). Point it at the team's key file, or "
        "unset it to use the state dir's own key."
    )


def _size_text(path: Path) -> str:
    """What the key file is instead of a key: its size, or its kind (``a FIFO (named pipe)``)."""
    try:
        info = path.stat()
    except OSError as exc:
        return str(exc.strerror or exc)
    return file_kind(info.st_mode) or f"{info.st_size} bytes"


def _unusable(path: Path, exc: OSError) -> UsageError:
    read_only = StateDirReadOnly.from_os_error(str(path.parent), exc)
    if read_only is not None:
        return read_only
    return UsageError(
        f"cannot use the secret key file {path} ({exc.strerror or exc}); secret params are "
        "sealed with it. Fix its permissions, or point --db / WF_MAGIC_HOME at a writable "
        "directory."
    )


def _create_key(path: Path) -> None:
    """Write a new random key to ``path`` (0600), unless another process just did."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_FILENAME}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(KEY_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another start created the key meanwhile: use theirs
    except FileExistsError:
        pass
    except OSError:  # no hard links on this filesystem: the last of racing creators wins
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
