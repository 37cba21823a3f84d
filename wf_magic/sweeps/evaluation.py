"""The evaluation reads of a ``Sweep`` (summary, paired, side by side, tokens, latency): each
reads the sweep's frame or its cells' attempts once and hands them to its module."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from . import accounting, resampling, sidebyside, stats
from .paired import Paired
from .paired import paired as paired_cells

if TYPE_CHECKING:
    import pandas as pd

    from ..store.sweeps import SweepRow


class Sweep(Protocol):
    """What the evaluations read of a sweep (``wf_magic.sweeps.handle.Sweep`` is one); a
    protocol, so this module does not import the handle that calls it."""

    @property
    def row(self) -> SweepRow: ...

    @property
    def axes(self) -> list[str]: ...

    def frame(self) -> pd.DataFrame: ...

    def attempts(self) -> pd.DataFrame: ...


def row_fields(sweep: Sweep) -> list[str]:
    """The fields of the sweep's dataset rows, in first-seen order (none without rows)."""
    rows = json.loads(sweep.row.definition_json).get("rows") or []
    return list(dict.fromkeys(name for row in rows for name in row))


def summary(
    sweep: Sweep,
    by: str | Sequence[str] = (),
    *,
    confidence: float = resampling.CONFIDENCE,
    resamples: int = resampling.RESAMPLES,
    seed: int = resampling.SEED,
) -> pd.DataFrame:
    """See ``Sweep.summary``."""
    names = stats.group_names(by, where="sweep summary")  # before any read
    frame = sweep.frame()
    latencies = accounting.step_latencies(sweep.attempts())
    return stats.summary_frame(
        frame,
        names,
        axes=sweep.axes,
        latencies=latencies,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def paired(
    sweep: Sweep,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    score: str,
    confidence: float = resampling.CONFIDENCE,
    resamples: int = resampling.RESAMPLES,
    seed: int = resampling.SEED,
) -> Paired:
    """See ``Sweep.paired``."""
    return paired_cells(
        sweep.frame(),
        a=a,
        b=b,
        score=score,
        axes=sweep.axes,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def side_by_side(
    sweep: Sweep,
    *,
    columns: str | Sequence[str],
    index: str | Sequence[str] | None = None,
    score: str | Sequence[str] | None = None,
    only: str | None = None,
    clip: int = sidebyside.CLIP,
) -> sidebyside.SideBySide:
    """See ``Sweep.side_by_side``."""
    return sidebyside.build(
        sweep.frame(),
        axes=sweep.axes,
        row_fields=row_fields(sweep),
        columns=columns,
        index=index,
        score=score,
        only=only,
        clip=clip,
    )


def tokens(sweep: Sweep, by: str = "step") -> pd.DataFrame:
    """See ``Sweep.tokens``."""
    accounting.check_by(by, sweep.axes, where="sweep tokens")
    return accounting.tokens_frame(sweep.attempts(), by)


def latency(sweep: Sweep, by: str = "step") -> pd.DataFrame:
    """See ``Sweep.latency``."""
    accounting.check_by(by, sweep.axes, where="sweep latency")
    return accounting.latency_frame(sweep.attempts(), by)
