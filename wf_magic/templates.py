"""The Jinja sandbox: StrictUndefined templates, native expression values, static references.

The sandbox also bounds what one render may cost, so a hostile template fails with a
``TemplateError`` instead of hanging or exhausting memory: a ``range()`` holds at most
``MAX_RANGE_ITEMS`` items; repetition, concatenation, padding, joins, replaces and
namespace values build at most ``MAX_ITEMS`` characters or items; a render writes at most
``MAX_OUTPUT`` characters (macro and ``set`` blocks included), runs at most ``MAX_STEPS``
loop iterations and calls, and takes at most ``MAX_RENDER_S`` seconds.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, nodes
from jinja2 import TemplateError as JinjaError
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

from .errors import clip

MAX_RANGE_ITEMS = 100_000
"""Items of one ``range()`` (ten map-unit bounds: a too-big map names the map bound)."""
MAX_ITEMS = 1_000_000
"""Characters of a string, or items of a (nested) list, that one operation may build."""
MAX_OUTPUT = 1_000_000
"""Characters one render may write, macro and ``set`` blocks included."""
MAX_STEPS = 1_000_000
"""Loop iterations plus calls in one render."""
MAX_RENDER_S = 5.0
"""Seconds one render may take."""
MAX_INT_BITS = 64_000
"""Bits of an integer that ``*`` or ``**`` may build (about 19 000 digits)."""

_WHOLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\{\{|\}\}).)*)\}\}\s*$", re.S)
_WIDE_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d{7,}|\d*\.(?:\*|\d{7,}))")
_WIDE_SPEC = re.compile(r"\d{7,}")
_SIZE_FILTERS = frozenset({"center", "indent", "batch", "slice", "truncate", "wordwrap"})
"""Filters whose integer arguments are sizes (bounded by ``MAX_ITEMS``)."""
_RENDER_ERRORS = (
    JinjaError,
    TypeError,
    ValueError,
    ArithmeticError,
    LookupError,
    AttributeError,
    RecursionError,
    MemoryError,
)


GLOBAL_NAMES = frozenset(
    {"range", "dict", "lipsum", "cycler", "joiner", "namespace", "true", "false", "none"}
)
"""Names every template may read besides its context (Jinja's globals and constants)."""


class TemplateError(Exception):
    """A template failed to parse or render; the caller adds run/step context."""


class _Budget:
    """What one render has spent: steps (loop iterations and calls) and characters written."""

    def __init__(self) -> None:
        self.steps = 0
        self.written = 0
        self.deadline = time.monotonic() + MAX_RENDER_S
        self.weighed: Any = None
        """The last value this render found within bounds (a filter's result is often the
        expression's value too: a map's 10 000 items are weighed once, not twice)."""

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateError(
                f"template runs more than {MAX_STEPS} loop iterations and calls; "
                "loop over less data"
            )
        if not self.steps & 0x3F and time.monotonic() > self.deadline:
            raise TemplateError(f"template took longer than {MAX_RENDER_S:g} s to render")

    def write(self, chars: int) -> None:
        self.written += chars
        if self.written > MAX_OUTPUT:
            raise TemplateError(
                f"template renders more than {MAX_OUTPUT} characters; shorten its output"
            )


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "wf_template_budget", default=None
)


def _spend() -> _Budget:
    return _budget.get() or _Budget()


_PLAIN_SCALARS = frozenset({int, float, bool, type(None)})


def _weight(value: Any) -> int:
    """Characters or items of ``value``; shared sublists count each time (stops past the bound)."""
    memo: dict[int, int] = {}

    def walk(v: Any, depth: int) -> int:
        if isinstance(v, str | bytes):
            return len(v)
        if not isinstance(v, list | tuple | dict):
            return 1
        if id(v) in memo:
            return memo[id(v)]
        if depth > 64:
            raise TemplateError("template builds values nested deeper than 64 levels")
        total = 0
        for item in v.values() if isinstance(v, dict) else v:
            # Scalars inline: a map's 10 000 items are weighed without a call each.
            if type(item) in _PLAIN_SCALARS:
                total += 1
            elif isinstance(item, str | bytes):
                total += len(item) or 1
            elif isinstance(item, list | tuple | dict):
                total += max(1, walk(item, depth + 1))
            else:
                total += 1
            if total > MAX_ITEMS:
                break
        memo[id(v)] = total
        return total

    return walk(value, 0)


def _check_size(value: Any, what: str) -> Any:
    budget = _budget.get()
    if budget is not None and value is budget.weighed:
        return value  # weighed already in this render (the sandbox cannot mutate it)
    if _weight(value) > MAX_ITEMS:
        raise TemplateError(f"{what} is more than {MAX_ITEMS} characters or items")
    if budget is not None:
        budget.weighed = value
    return value


def _finalize(value: Any) -> Any:
    # Structured values interpolated into text read as JSON, not Python reprs.
    if isinstance(value, dict | list | tuple):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    elif value is None:
        value = ""
    budget = _budget.get()
    if budget is not None:
        budget.write(len(value) if isinstance(value, str) else 1)
    return value


def _bounded_range(*args: int) -> range:
    items = range(*args)
    if len(items) > MAX_RANGE_ITEMS:
        raise TemplateError(
            f"template asks for a range of {len(items)} items; at most {MAX_RANGE_ITEMS}"
        )
    return items


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if not (0 <= n <= 100 and 0 <= min <= max <= 1000):
        raise TemplateError("lipsum() takes at most 100 paragraphs of at most 1000 words")
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))


class _BoundedNamespace(Namespace):
    """``namespace()`` whose values cannot grow past the bound (no doubling loops)."""

    def __setitem__(self, name: str, value: Any) -> None:
        _check_size(value, f"namespace value {name!r}")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise TemplateError(f"namespace value {name!r} is an integer over {MAX_INT_BITS} bits")
        super().__setitem__(name, value)


def _iterate(values: Iterable[Any], literal_chars: int) -> Iterator[Any]:
    """A ``for`` loop's iterable: each iteration is a step and writes the body's literal text."""
    budget = _spend()
    for value in values:
        budget.tick()
        budget.write(literal_chars)
        yield value


def _literal_chars(body: list[nodes.Node]) -> int:
    """Literal text one iteration of a loop body may write (nested loops count their own)."""
    total = 0
    stack: list[nodes.Node] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.TemplateData):
            total += len(node.data)
        elif isinstance(node, nodes.Const) and isinstance(node.value, str):
            total += len(node.value)  # a folded ``{{ 'text' }}`` is literal text too
        elif not isinstance(node, nodes.For | nodes.Macro | nodes.CallBlock):
            stack.extend(node.iter_child_nodes())
    return total


class _BoundedCodeGenerator(CodeGenerator):
    """Routes every ``for`` loop's iterable through ``_iterate``, where the loop budget lives."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in node.find_all(nodes.For):
            if not isinstance(loop, nodes.For):  # find_all is typed loosely
                continue
            weight = nodes.Const(_literal_chars(loop.body), lineno=loop.lineno)
            loop.iter = nodes.Filter(
                loop.iter, "wf_iterate", [weight], [], None, None, lineno=loop.lineno
            )
            loop.iter.set_environment(self.environment)
        super().visit_Template(node, frame)


def _replaced_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    old, new = str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def _check_estimate(size: int, what: str) -> None:
    if size > MAX_ITEMS:
        raise TemplateError(f"{what} would make more than {MAX_ITEMS} characters")


def _check_str_method(owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a str method call whose result would pass the bound, before making it."""
    values = [*args, *kwargs.values()]
    if name == "format_map" and args and isinstance(args[0], Mapping):
        values.extend(args[0].values())
    for value in values:
        if isinstance(value, int) and abs(value) > MAX_ITEMS:
            raise TemplateError(f"str.{name}() argument {value} is larger than {MAX_ITEMS}")
    if name in ("format", "format_map"):
        for _, _, spec, _ in string.Formatter().parse(owner):
            if spec and _WIDE_SPEC.search(spec):
                raise TemplateError(f"format width {clip(spec, 40)!r} is larger than {MAX_ITEMS}")
    elif name == "expandtabs":
        tab = int(args[0]) if args and isinstance(args[0], int) else 8
        _check_estimate(len(owner) + owner.count("\t") * tab, "str.expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _check_estimate(_replaced_size(owner, *args[:3]), "str.replace()")
    elif name == "join" and args and isinstance(args[0], list | tuple):
        _check_estimate(_weight(args[0]) + len(owner) * len(args[0]), "str.join()")


def _check_filter(name: str, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Refuse a filter call whose result would pass the bound; ``args`` starts at the value."""
    if name in _SIZE_FILTERS:
        for value in [*args[1:], *kwargs.values()]:
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ITEMS:
                raise TemplateError(f"filter {name}: argument {value} is larger than {MAX_ITEMS}")
    if not args:
        return args
    text = str(args[0]) if name in ("indent", "replace", "format") else ""
    if name == "indent":
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        per_line = width if isinstance(width, int) else len(str(width))
        _check_estimate(len(text) + (text.count("\n") + 1) * per_line, "filter indent")
    elif name == "replace" and len(args) >= 3:
        _check_estimate(_replaced_size(text, *args[1:4]), "filter replace")
    elif name == "format" and _WIDE_PERCENT.search(text):
        raise TemplateError(f"format width in {clip(text, 40)!r} is larger than {MAX_ITEMS}")
    elif name == "join":
        if not isinstance(args[0], list | tuple | str):
            args[0] = list(args[0])  # a generator (``map``) is measured before it is joined
        sep = args[1] if len(args) > 1 else kwargs.get("d", "")
        _check_estimate(_weight(args[0]) + len(str(sep)) * len(args[0]), "filter join")
    return args


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(fn)  # keeps jinja_pass_arg, so Jinja still passes the context first
    def guarded(*args: Any, **kwargs: Any) -> Any:
        checked = _check_filter(name, list(args[skip:]), kwargs)
        result = fn(*args[:skip], *checked, **kwargs)
        return _check_size(result, f"filter {name}'s result")

    return guarded


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with mapping keys winning over attributes (``params.items`` is the param)
    and every operation that can build a large value or run long checked against the budget."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def make_globals(self, d: MutableMapping[str, Any] | None) -> dict[str, Any]:
        # A flat dict rather than Jinja's ChainMap over the environment's globals: every
        # render copies the globals into its context, and copying a ChainMap walks it in
        # Python. Ours are set once at import, before any template is compiled.
        return {**self.globals, **(d or {})}

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _spend().tick()
        for arg in (*args, *kwargs.values()):
            _check_size(arg, "a call argument")
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str):
            _check_str_method(owner, getattr(target, "__name__", ""), args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        return _check_size(result, "a call's result")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            _check_repeat(left, right)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            bits = right * max(abs(left) - 1, 0).bit_length()
            if bits > MAX_INT_BITS:
                raise TemplateError(f"power would have about {bits} bits; at most {MAX_INT_BITS}")
        elif operator == "+" and isinstance(left, str | list | tuple):
            if isinstance(right, str | list | tuple):
                _check_estimate(_weight(left) + _weight(right), "concatenation")
        elif operator == "%" and isinstance(left, str) and _WIDE_PERCENT.search(left):
            raise TemplateError(f"format width in {clip(left, 40)!r} is larger than {MAX_ITEMS}")
        return super().call_binop(context, operator, left, right)


def _check_repeat(left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateError(f"product would have more than {MAX_INT_BITS} bits")
        return
    seq, times = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(seq, str | list | tuple) and isinstance(times, int):
        made = max(1, _weight(seq)) * times
        if made > MAX_ITEMS:
            raise TemplateError(f"repetition would make {made} items; at most {MAX_ITEMS}")


_env = _Sandbox(
    undefined=StrictUndefined,
    finalize=_finalize,
    autoescape=False,
    keep_trailing_newline=True,
)
_env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, sort_keys=True)
_env.filters = {name: _guard_filter(name, fn) for name, fn in _env.filters.items()}
_env.filters["wf_iterate"] = _iterate
_env.globals.update(range=_bounded_range, lipsum=_bounded_lipsum, namespace=_BoundedNamespace)


@functools.lru_cache(maxsize=4096)
def _template(source: str) -> Any:
    return _env.from_string(source)


@functools.lru_cache(maxsize=4096)
def _expression(expr: str) -> Any:
    return _env.compile_expression(expr, undefined_to_none=False)


def _failure(exc: BaseException) -> TemplateError:
    if isinstance(exc, RecursionError):
        return TemplateError("template recurses or nests too deeply")
    if isinstance(exc, MemoryError):
        return TemplateError("template ran out of memory")
    return TemplateError(clip(str(exc), 300))


def whole_expression(source: str) -> str | None:
    """The inner expression when ``source`` is exactly one ``{{ ... }}``, else None."""
    match = _WHOLE_EXPR.match(source)
    return match.group("expr") if match else None


def render_text(source: str, context: Mapping[str, Any]) -> str:
    """Render ``source`` as text, within the render bounds.

    Raises:
        TemplateError: an undefined name, a sandbox violation, a passed bound or any
            render error.
    """
    if "{" not in source and "\r" not in source:
        # No delimiter, no newline to normalise: Jinja would render the text unchanged
        # (keep_trailing_newline), after compiling it (~150 µs for every distinct text).
        if len(source) > MAX_OUTPUT:
            raise TemplateError(
                f"template renders more than {MAX_OUTPUT} characters; shorten its output"
            )
        return source
    token = _budget.set(_Budget())
    try:
        out: list[str] = []
        written = 0
        for chunk in _template(source).generate(context):
            written += len(chunk)
            if written > MAX_OUTPUT:
                raise TemplateError(
                    f"template renders more than {MAX_OUTPUT} characters; shorten its output"
                )
            out.append(chunk)
        return "".join(out)
    except _RENDER_ERRORS as exc:
        raise _failure(exc) from exc
    finally:
        _budget.reset(token)


def evaluate(source: str, context: Mapping[str, Any]) -> Any:
    """Evaluate ``source`` to a native value when it is one ``{{ expr }}``, else render text."""
    expr = whole_expression(source)
    if expr is None:
        return render_text(source, context)
    return evaluate_expression(expr, context)


def evaluate_expression(expr: str, context: Mapping[str, Any]) -> Any:
    """Evaluate a bare Jinja expression (no braces) to a native value, within the bounds.

    Raises:
        TemplateError: as ``render_text``, or the value is undefined or too large.
    """
    token = _budget.set(_Budget())
    try:
        value = _check_size(_expression(expr)(**context), "the expression's value")
    except _RENDER_ERRORS as exc:
        raise _failure(exc) from exc
    finally:
        _budget.reset(token)
    if hasattr(value, "_undefined_name"):
        raise TemplateError(f"{value._undefined_name!r} is undefined")
    return value


@dataclass(frozen=True, slots=True)
class References:
    """What a template names: top-level names, ``steps.X`` ids and ``params.X`` names."""

    names: frozenset[str]
    steps: frozenset[str]
    params: frozenset[str]
    step_fields: frozenset[tuple[str, str]] = frozenset()
    """``(step id, field)`` for every ``steps.<id>.<field>`` (only ``output`` exists)."""
    filters: frozenset[str] = frozenset()
    """The filters the template applies, ``map('name')`` included (``random`` makes a
    render nondeterministic)."""
    tests: frozenset[str] = frozenset()
    """The tests the template applies (``is odd``, ``select('odd')``)."""
    steps_dynamic: bool = False
    """``steps`` is used other than as ``steps.<literal id>`` (``steps[x]``, ``steps | f``):
    ``steps`` lists only the literal ids, so any step's output may be read."""
    params_dynamic: bool = False
    """The same for ``params``: any param may be read."""


def references(source: str, *, expression: bool = False) -> References:
    """Parse ``source`` (a template, or a bare expression) and list what it refers to.

    Raises:
        TemplateError: the source is not valid Jinja, or nests too deeply to parse.
    """
    text = "{{ " + source + " }}" if expression else source
    try:
        ast = _env.parse(text)
    except TemplateSyntaxError as exc:
        raise TemplateError(
            f"invalid template: {clip(exc.message or '', 200)} (template line {exc.lineno})"
        ) from exc
    except RecursionError as exc:
        raise TemplateError("template nests too deeply to parse; flatten it") from exc
    assigned = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    loads = [n for n in ast.find_all(nodes.Name) if n.ctx == "load"]
    names = {n.name for n in loads} - assigned
    steps: set[str] = set()
    params: set[str] = set()
    fields: set[tuple[str, str]] = set()
    literal: dict[str, int] = {"steps": 0, "params": 0}
    for node in ast.find_all((nodes.Getattr, nodes.Getitem)):
        if not isinstance(node, (nodes.Getattr, nodes.Getitem)):
            continue
        base = node.node
        if isinstance(base, nodes.Name) and base.name in ("steps", "params"):
            key = _attr_key(node)
            if key is not None:
                (steps if base.name == "steps" else params).add(key)
                # ``params.items()`` reads every param when none is named ``items``.
                is_method = isinstance(node, nodes.Getattr) and key in _MAPPING_METHODS
                literal[base.name] += not is_method
        inner = base.node if isinstance(base, (nodes.Getattr, nodes.Getitem)) else None
        if isinstance(inner, nodes.Name) and inner.name == "steps":
            step_id, field = _attr_key(base), _attr_key(node)  # type: ignore[arg-type]
            if step_id is not None and field is not None:
                fields.add((step_id, field))
    filters: set[str] = set()
    for node in ast.find_all(nodes.Filter):
        if isinstance(node, nodes.Filter):
            filters.add(node.name)
            first = node.args[0] if node.args else None  # ``map('upper')`` applies a filter
            if (
                node.name == "map"
                and isinstance(first, nodes.Const)
                and isinstance(first.value, str)
            ):
                filters.add(first.value)
    tests: set[str] = set()
    for node in ast.find_all((nodes.Test, nodes.Filter)):
        if isinstance(node, nodes.Test):
            tests.add(node.name)
        elif isinstance(node, nodes.Filter):
            # ``select('odd')`` and ``selectattr('x', 'odd')`` apply a test by name.
            at = _TEST_ARG.get(node.name)
            arg = node.args[at] if at is not None and len(node.args) > at else None
            if isinstance(arg, nodes.Const) and isinstance(arg.value, str):
                tests.add(arg.value)
    dynamic = {
        name: name in assigned or count < sum(n.name == name for n in loads)
        for name, count in literal.items()
    }
    return References(
        frozenset(names),
        frozenset(steps),
        frozenset(params),
        frozenset(fields),
        filters=frozenset(filters),
        tests=frozenset(tests),
        steps_dynamic=dynamic["steps"],
        params_dynamic=dynamic["params"],
    )


_TEST_ARG = {"select": 0, "reject": 0, "selectattr": 1, "rejectattr": 1}
"""Filters that apply a test named by a string argument, and that argument's position."""


def unknown_callables(refs: References) -> list[str]:
    """The filters and tests ``refs`` names that the sandbox does not have, worded for an
    error (``filter 'nosuch'``); empty when all exist."""
    return [f"filter {name!r}" for name in sorted(refs.filters - set(_env.filters))] + [
        f"test {name!r}" for name in sorted(refs.tests - set(_env.tests))
    ]


_MAPPING_METHODS = frozenset(name for name in dir(dict) if not name.startswith("_"))


def _attr_key(node: nodes.Getattr | nodes.Getitem) -> str | None:
    if isinstance(node, nodes.Getattr):
        return str(node.attr)
    if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
        return node.arg.value
    return None
