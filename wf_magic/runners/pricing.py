"""What an attempt cost: its runner's figure, its ``prices:``/``local:`` options, else genai-prices.

Every runner may be given two pricing options under ``runners: {name: {...}}``:

- ``prices: {MODEL: {input_per_mtok, output_per_mtok[, cache_read_per_mtok,
  cache_write_per_mtok]}}`` — dollars per million tokens; ``{MODEL: 0}`` makes a model free.
- ``local: true`` — every model of this runner is free (an Ollama on your laptop).

An attempt whose runner reported no cost is priced from those, else from the bundled
`genai-prices` catalogue (a pinned version, read from the installed package: no network). A
model nobody prices costs null, never 0, and so do estimated token counts. The source of a
price is kept with the attempt (``price_source``: ``runner``, ``runners.NAME.prices``,
``runners.NAME.local`` or ``genai-prices X.Y.Z``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RunnerError

PRICE_OPTIONS = frozenset({"prices", "local"})
"""The pricing options every built-in runner accepts (never part of the reuse identity)."""
OFFLINE = "offline"
"""``UnitResult.provider`` of answers no provider served (never looked up in a catalogue)."""
_RATES = ("input_per_mtok", "output_per_mtok", "cache_read_per_mtok", "cache_write_per_mtok")


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """Dollars per million tokens for one model (cache rates default to the input rate)."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def cost(
        self, tokens_in: int, tokens_out: int, *, cache_read: int = 0, cache_write: int = 0
    ) -> float:
        """The cost of one call; ``tokens_in`` includes the cache reads and writes."""
        plain = max(0, tokens_in - cache_read - cache_write)
        read = self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok
        write = (
            self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        )
        dollars = plain * self.input_per_mtok + cache_read * read + cache_write * write
        return (dollars + tokens_out * self.output_per_mtok) / 1e6


FREE = Price(input_per_mtok=0.0, output_per_mtok=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """A runner's ``prices:`` and ``local:`` options."""

    prices: Mapping[str, Price] = field(default_factory=dict)
    local: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, Any], *, where: str) -> PriceTable:
        """The table in ``options`` (other keys ignored).

        Raises:
            RunnerError: permanent, naming ``where.prices.MODEL`` or ``where.local``.
        """
        local = options.get("local", False)
        if not isinstance(local, bool):
            raise _option_error(f"{where}.local", "true or false", local)
        return cls(prices=_parse_prices(options.get("prices"), where), local=local)

    def price(self, model: str | None, *also: str | None) -> tuple[Price, str] | None:
        """The price of ``model`` (or of another name it answered as) and its source."""
        if self.local:
            return FREE, "local"
        for name in (model, *also):
            if name and name in self.prices:
                return self.prices[name], "prices"
        return None


def attempt_cost(
    *,
    runner: str,
    options: Mapping[str, Any] | None,
    model: str | None,
    tokens_in: int,
    tokens_out: int,
    cache_read: int = 0,
    cache_write: int = 0,
    provider: str | None = None,
    also: tuple[str, ...] = (),
    catalogue_model: str | None = None,
) -> tuple[float | None, str | None]:
    """(cost, price source) of usage a runner reported without a cost; (None, None) unpriced.

    ``options`` is the runner's ``runners:`` section (its table wins over the catalogue;
    ``also``: other names of the model it may list); ``provider`` a genai-prices provider
    id, or the API's base URL; ``catalogue_model`` the name genai-prices knows (default
    ``model``).
    """
    table = _table(runner, options)
    found = table.price(model, *also) if table is not None else None
    if found is not None:
        price, source = found
        cost = price.cost(tokens_in, tokens_out, cache_read=cache_read, cache_write=cache_write)
        return cost, f"runners.{runner}.{source}"
    if not model or provider == OFFLINE:
        return None, None
    return catalogue_cost(
        catalogue_model or model,
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cache_read=cache_read,
        cache_write=cache_write,
        provider=provider,
    )


def catalogue_cost(
    model: str,
    *,
    tokens_in: int,
    tokens_out: int,
    cache_read: int = 0,
    cache_write: int = 0,
    provider: str | None = None,
) -> tuple[float | None, str | None]:
    """(cost, ``genai-prices X.Y.Z``) from the bundled catalogue; (None, None) when it does not
    know the model (or genai-prices is not installed)."""
    key = (model, provider)
    if key in _misses:
        return None, None
    try:
        import genai_prices
    except ImportError:
        return None, None
    where: dict[str, str] = {}
    if provider and "://" in provider:
        where["provider_api_url"] = provider
    elif provider:
        where["provider_id"] = provider
    usage = genai_prices.Usage(
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        cache_read_tokens=cache_read or None,
        cache_write_tokens=cache_write or None,
    )
    try:
        calculation = genai_prices.calc_price(usage, model, **where)  # type: ignore[call-overload]
    except (LookupError, ValueError):
        with _lock:
            _misses.add(key)
        return None, None
    return float(calculation.total_price), f"genai-prices {genai_prices.__version__}"


_misses: set[tuple[str, str | None]] = set()
"""Models the catalogue did not know (a miss costs a scan of it; asked once a process)."""
_lock = threading.Lock()
_tables: dict[tuple[str, str], PriceTable | None] = {}


def _table(runner: str, options: Mapping[str, Any] | None) -> PriceTable | None:
    if not options or not (PRICE_OPTIONS & set(options)):
        return None
    from ..hashing import canonical_json

    key = (runner, canonical_json({k: options.get(k) for k in sorted(PRICE_OPTIONS)}))
    if key not in _tables:
        try:
            table: PriceTable | None = PriceTable.parse(options, where=f"runners.{runner}")
        except RunnerError:
            table = None  # refused when the plan was frozen; nothing to price by here
        with _lock:
            _tables[key] = table
    return _tables[key]


def _parse_prices(raw: Any, where: str) -> dict[str, Price]:
    if raw is None:
        return {}
    expected = "0 or {input_per_mtok: number, output_per_mtok: number}"
    if not isinstance(raw, Mapping):
        raise _option_error(f"{where}.prices", f"a mapping {{model: {expected}}}", raw)
    prices = {}
    for model, entry in raw.items():
        if entry == 0 and not isinstance(entry, bool):
            prices[str(model)] = FREE
            continue
        try:
            if not isinstance(entry, Mapping) or set(entry) - set(_RATES):
                raise TypeError(entry)
            rates = {k: float(entry[k]) for k in _RATES if entry.get(k) is not None}
            if any(v < 0 or v != v for v in rates.values()) or any(
                isinstance(entry[k], bool) for k in rates
            ):
                raise ValueError(entry)
            prices[str(model)] = Price(**rates)
        except (TypeError, KeyError, ValueError) as exc:
            raise _option_error(f"{where}.prices.{model}", expected, entry) from exc
    return prices


def _option_error(name: str, expected: str, got: Any) -> RunnerError:
    return RunnerError(f"{name}: expected {expected} (got {got!r}).")
