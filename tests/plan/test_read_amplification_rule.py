"""PlanSummary and StreamStats agree on read amplification when nothing is yielded."""

from __future__ import annotations

import math

import pytest

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan


def summary(bytes_decoded: int, bytes_yielded: int) -> dzplan.PlanSummary:
    window = dzplan.WindowSummary(
        index=0,
        samples=0,
        batches=0,
        chunks=((0,),) if bytes_decoded else ((),),
        bytes_decoded=bytes_decoded,
        bytes_held=0,
        tasks=2,
    )
    return dzplan.PlanSummary(
        windows=(window,),
        shuffle="none",
        batch_size=4,
        n_samples=0,
        n_batches=0,
        bytes_yielded=bytes_yielded,
        dataset_bytes=bytes_decoded,
    )


@pytest.mark.parametrize(
    ("bytes_read", "bytes_yielded", "expected"),
    [(0, 0, 0.0), (400, 0, math.inf), (400, 400, 1.0), (1000, 400, 2.5), (0, 400, 0.0)],
)
def test_read_amplification_rule(bytes_read: int, bytes_yielded: int, expected: float) -> None:
    from daskzarr_batches.plan.summary import read_amplification

    assert read_amplification(bytes_read, bytes_yielded) == expected
    assert summary(bytes_read, bytes_yielded).read_amplification == expected
    stats = dzb.StreamStats(bytes_read=bytes_read, bytes_yielded=bytes_yielded)
    assert stats.read_amplification == expected


def test_plan_summary_reading_without_yielding_is_infinite() -> None:
    plan = summary(4096, 0)
    assert plan.read_amplification == math.inf
    assert plan.totals()["read_amplification"] == math.inf
    assert "read amplification inf" in str(plan)
