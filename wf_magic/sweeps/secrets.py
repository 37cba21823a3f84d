"""A sweep's fixed params (the same in every cell) with its secret params sealed, and the
secret values a resumed sweep is handed again, checked against their seals."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from ..redact import is_secret_key
from ..sealing import Sealed, Sealer, env_name, has_secrets, is_seal, seals_of
from ..spec.params import coerce_param, normalise
from ..spec.plan import Plan


def holds_secret(name: str, value: Any) -> bool:
    """Whether the param ``name`` with ``value`` is, or holds, a secret."""
    return is_secret_key(name) or has_secrets({name: value})


def not_an_axis(what: str, name: str) -> UsageError:
    """The refusal of a secret param as a grid axis or a rows column."""
    if not is_secret_key(name):
        return UsageError(
            f"sweep {what} {name!r} holds a secret (a value with a secret-named key), and a "
            f"secret is not an axis: pass its one value with params={{{name!r}: ...}} or "
            f"`--param {name}=VALUE`"
        )
    return UsageError(
        f"sweep {what} {name!r} is a secret param, and a secret is not an axis: pass its one "
        f"value with `--param {name}=VALUE`, params={{{name!r}: ...}} or {env_name(name)}"
    )


def fixed_params(
    state_dir: Any,
    plan: Plan,
    given: Mapping[str, Any] | None,
    *,
    from_strings: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Sealed:
    """The params every cell shares, secret values sealed: ``given`` (``--param`` /
    ``params=``), each secret param not given from ``WF_PARAM_<NAME>`` or else its default.

    Raises:
        UsageError: a param the workflow does not declare, or a value of the wrong type.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for name, value in (given or {}).items():
        if name not in plan.params:
            raise UsageError(
                f"sweep param {name!r} is not a param of workflow {plan.name!r}; "
                f"declared: {sorted(plan.params) or 'none'}"
            )
        if from_strings and isinstance(value, str):
            value = coerce_param(plan.params[name], value, name=name)
        out[name] = normalise(value)
    for name, schema in plan.params.items():
        if name in out:
            continue
        text = env.get(env_name(name))
        if is_secret_key(name) and text is not None:
            out[name] = normalise(coerce_param(schema, text, name=name))
        elif "default" in schema and holds_secret(name, schema["default"]):
            out[name] = normalise(schema["default"])
    if not has_secrets(out):
        return Sealed(params=out, vault={})
    return Sealer.ensure(state_dir).seal_params(out)


def resupplied(
    state_dir: Any,
    sweep_id: str,
    plan: Plan,
    stored: Mapping[str, Any],
    *,
    given: Mapping[str, Any] | None,
    known: Mapping[str, Any],
    from_strings: bool = False,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Seal → value of a stored sweep's secret params, for a resume.

    Each is taken, in order, from ``given``, from ``known`` (values this engine was handed),
    from ``WF_PARAM_<NAME>``, or from the param's default, and checked against its seal.

    Raises:
        UsageError: a secret param is missing or differs from the value the sweep started
            with, the state dir's key file is gone, or a given param is not a secret one of
            the sweep.
    """
    env = os.environ if environ is None else environ
    given = dict(given or {})
    for name in given:
        if not seals_of(stored.get(name), name=name):
            raise UsageError(
                f"sweep {sweep_id}: --param {name} is not one of its secret params (those "
                "are handed back on a resume; its other params are fixed)"
            )
    vault: dict[str, Any] = {}
    for name, value in stored.items():
        seals = seals_of(value, name=name)
        if not seals:
            continue
        if name not in given and all(s in known for s in seals):
            vault.update((s, known[s]) for s in seals)
            continue
        vault.update(_checked(state_dir, sweep_id, plan, name, value, given, env, from_strings))
    return vault


def _checked(
    state_dir: Any,
    sweep_id: str,
    plan: Plan,
    name: str,
    stored: Any,
    given: Mapping[str, Any],
    env: Mapping[str, str],
    from_strings: bool,
) -> dict[str, Any]:
    """Seal → value of one secret param, its value checked against its stored seal."""
    schema = plan.params.get(name, {})
    if name in given:
        value, text = given[name], from_strings
    elif env.get(env_name(name)) is not None:
        value, text = env[env_name(name)], True
    elif "default" in schema:
        value, text = schema["default"], False
    else:
        raise missing_sweep_secret(sweep_id, name)
    if text and isinstance(value, str):
        value = coerce_param(schema, value, name=name)
    sealer = Sealer.existing(state_dir)
    if sealer is None:
        raise UsageError(
            f"sweep {sweep_id}: its secret params were sealed with {state_dir}/secret.key, "
            "which is gone, so no value can be checked against them. Restore the file, or "
            "start a new sweep."
        )
    whole = (name,) if is_seal(stored) and not is_secret_key(name) else ()
    sealed = sealer.seal_params({name: normalise(value)}, whole=whole)
    if sealed.params[name] != stored:
        if name not in given and env.get(env_name(name)) is None:
            raise missing_sweep_secret(sweep_id, name)
        raise UsageError(
            f"sweep {sweep_id}: the secret param {name!r} differs from the value the sweep "
            "started with (its keyed hash does not match). Pass the original value, or start "
            "a new sweep for the new one."
        )
    return sealed.vault


def missing_sweep_secret(sweep_id: str, name: str) -> UsageError:
    """A resumed sweep's secret param was not handed back."""
    return UsageError(
        f"sweep {sweep_id} has the secret param {name!r}, whose value is never stored; pass it "
        f"again to drive its cells: `wf sweep-resume {sweep_id} --param {name}=VALUE`, "
        f"params={{{name!r}: ...}} in Python, or the environment variable {env_name(name)}"
    )
