"""Prices (issue 22, item 3): a runner's own cost, else its ``prices:``/``local:`` options, else
genai-prices; the source is kept with the attempt, an unknown model costs null, ``max_cost``
binds on every runner."""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest

from wf_magic import Engine, load_workflow
from wf_magic.errors import WorkflowError
from wf_magic.inspection import record_text
from wf_magic.runners.pricing import Price, PriceTable, attempt_cost, catalogue_cost

GENAI = f"genai-prices {genai_prices.__version__}"


def genai_cost(model: str, tokens_in: int, tokens_out: int, **cache: int) -> float:
    usage = genai_prices.Usage(input_tokens=tokens_in, output_tokens=tokens_out, **cache)
    return float(genai_prices.calc_price(usage, model).total_price)


def priced_source(model: str, options: str = "", *, units: int = 1, budget: str = "") -> str:
    return f"""
name: priced
{budget}
runner: scripted
runners:
  scripted:
    rules:
      - {{match: "^Write", model: "{model}", tokens_in: 1000, tokens_out: 1000, reply: ok}}
    {options}
steps:
  - id: draft
    map: "{{{{ range({units}) | list }}}}"
    prompt: "Write {{{{ item }}}}"
"""


def costs(engine: Engine, run_id: str) -> list[float | None]:
    return [a.cost for a in engine.attempts(run_id)]


def test_a_known_models_attempt_costs_what_genai_prices_says(engine: Engine) -> None:
    run = engine.run(priced_source("gpt-4o-mini"))
    assert run.status == "completed", run.reason
    expected = genai_cost("gpt-4o-mini", 1000, 1000)
    assert expected == pytest.approx(0.00075)  # $0.15 and $0.60 a million
    assert costs(engine, run.run_id) == [expected]
    record = run.attempt("draft[0]")
    assert record.price_source == GENAI
    assert f"1000+1000 tokens, $0.00075 ({GENAI})" in record_text(record)


@pytest.mark.parametrize("model", ["no-such-model-zz9", ""])
def test_an_unknown_model_costs_null_never_zero(engine: Engine, model: str) -> None:
    run = engine.run(priced_source(model))
    assert run.status == "completed", run.reason
    assert costs(engine, run.run_id) == [None]
    assert run.attempt("draft[0]").price_source is None


def test_the_scripted_runners_own_model_is_never_looked_up(engine: Engine) -> None:
    run = engine.run("name: plain\nsteps:\n  - id: a\n    prompt: hi\n")
    assert [(a.model, a.cost) for a in engine.attempts(run.run_id)] == [("scripted-1", None)]


@pytest.mark.parametrize(
    ("options", "cost", "source"),
    [
        (
            "prices: {gpt-4o-mini: {input_per_mtok: 1, output_per_mtok: 2}}",
            0.003,
            "runners.scripted.prices",
        ),
        ("prices: {gpt-4o-mini: 0}", 0.0, "runners.scripted.prices"),
        ("local: true", 0.0, "runners.scripted.local"),
        ("prices: {other-model: 0}", genai_cost("gpt-4o-mini", 1000, 1000), GENAI),
    ],
)
def test_the_runners_price_options_win(
    engine: Engine, options: str, cost: float, source: str
) -> None:
    run = engine.run(priced_source("gpt-4o-mini", options))
    assert costs(engine, run.run_id) == [pytest.approx(cost)]
    assert run.attempt("draft[0]").price_source == source


def test_max_cost_stops_a_run_of_priced_units_at_the_documented_unit(engine: Engine) -> None:
    # 0.00075 a unit: after three (0.00225) nothing is left of 0.002; draft[3] never starts.
    run = engine.run(priced_source("gpt-4o-mini", units=5, budget="budget: {max_cost: 0.002}"))
    assert run.status == "failed"
    assert [a.unit_id for a in engine.attempts(run.run_id)] == ["draft[0]", "draft[1]", "draft[2]"]
    assert "max_cost used 0.0023 of 0.0020; unit draft[3] was not dispatched" in (run.reason or "")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ("prices: [gpt]", "runners.scripted.prices"),
        ("prices: {m: 1}", "runners.scripted.prices.m"),
        ("prices: {m: {input_per_mtok: 1}}", "runners.scripted.prices.m"),
        ("prices: {m: {input_per_mtok: -1, output_per_mtok: 1}}", "runners.scripted.prices.m"),
        ("prices: {m: {input_per_mtok: true, output_per_mtok: 1}}", "runners.scripted.prices.m"),
        (
            "prices: {m: {input_per_mtok: 1, output_per_mtok: 1, per_call: 2}}",
            "runners.scripted.prices.m",
        ),
        ("local: yes-please", "runners.scripted.local"),
    ],
)
def test_a_bad_price_option_is_refused_when_frozen(options: str, field: str) -> None:
    with pytest.raises(WorkflowError, match=rf"{field}: expected"):
        load_workflow(priced_source("m", options))


def test_cache_tokens_are_part_of_tokens_in_and_priced_at_their_own_rates() -> None:
    price = Price(
        input_per_mtok=3, output_per_mtok=15, cache_read_per_mtok=0.3, cache_write_per_mtok=3.75
    )
    # 1000 in, of which 200 read and 50 written: 750 plain.
    assert price.cost(1000, 100, cache_read=200, cache_write=50) == pytest.approx(
        (750 * 3 + 200 * 0.3 + 50 * 3.75 + 100 * 15) / 1e6
    )
    cost, source = catalogue_cost(
        "claude-sonnet-4-5",
        tokens_in=1000,
        tokens_out=100,
        cache_read=200,
        cache_write=50,
        provider="anthropic",
    )
    assert (cost, source) == (
        pytest.approx((750 * 3 + 200 * 0.3 + 50 * 3.75 + 100 * 15) / 1e6),
        GENAI,
    )
    assert Decimal(str(cost)) > 0


def test_a_provider_given_by_url_prices_only_when_the_catalogue_knows_the_url() -> None:
    known = attempt_cost(
        runner="openai",
        options=None,
        model="gpt-4o-mini",
        tokens_in=1000,
        tokens_out=1000,
        provider="https://api.openai.com/v1",
    )
    assert known == (pytest.approx(0.00075), GENAI)
    local = attempt_cost(
        runner="openai",
        options=None,
        model="gpt-4o-mini",
        tokens_in=1000,
        tokens_out=1000,
        provider="http://127.0.0.1:11434/v1",
    )
    assert local == (None, None)


def test_a_price_table_reads_local_and_zero() -> None:
    table = PriceTable.parse({"prices": {"a": 0}}, where="runners.x")
    assert table.price("a") is not None and table.price("b") is None
    assert PriceTable.parse({"local": True}, where="runners.x").price("anything") is not None


def warnings_of(engine: Engine, run_id: str) -> list[tuple[str | None, dict[str, object]]]:
    """The run's journaled ``warning`` events: (unit, data)."""
    import json

    rows = engine.store.events_after(run_id)
    return [(e.unit_id, json.loads(e.data_json or "{}")) for e in rows if e.kind == "warning"]


def test_max_cost_over_an_unpriced_model_warns_once_that_it_cannot_count_it(
    engine: Engine,
) -> None:
    seen: list[str] = []
    engine.subscribe(lambda e: seen.append(e.data["message"]) if e.kind == "warning" else None)
    source = priced_source("no-such-model-zz9", units=3, budget="budget: {max_cost: 0.002}")
    run = engine.run(source)
    assert run.status == "completed", run.reason  # unpriced attempts add nothing to max_cost
    message = (
        "cost is unknown for model no-such-model-zz9 (runner scripted), so max_cost cannot "
        "count it: unit draft[0] used 2,000 tokens at no known price. Give the price "
        "(runners.scripted.prices), declare the runner local (local: true), or install "
        "genai-prices (wf_magic[prices])."
    )
    assert warnings_of(engine, run.run_id) == [
        (
            "draft[0]",
            {
                "message": message,
                "reason": "cost_unknown",
                "model": "no-such-model-zz9",
                "runner": "scripted",
            },
        )
    ]
    assert seen == [message]  # the progress line and the run view show it too


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        ("gpt-4o-mini", "budget: {max_cost: 1.0}"),  # priced: nothing to warn about
        ("no-such-model-zz9", "budget: {max_tokens: 100000}"),  # no max_cost to miss it
    ],
)
def test_no_unknown_cost_warning_without_max_cost_or_with_a_price(
    engine: Engine, model: str, budget: str
) -> None:
    run = engine.run(priced_source(model, units=2, budget=budget))
    assert run.status == "completed", run.reason
    assert warnings_of(engine, run.run_id) == []


def test_the_openai_extra_brings_the_pinned_price_catalogue() -> None:
    import tomllib

    from tests.conftest import ROOT

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "genai-prices==0.2.3" in extras["openai"]
    assert f"genai-prices=={genai_prices.__version__}" in extras["prices"]
