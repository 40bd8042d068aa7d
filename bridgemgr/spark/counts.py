"""What one task of a runner=spark link's sink did: the executor's Transfer makes it, the
driver's commit sums it per batch. Spark unpickles it in short-lived processes, so this
module imports nothing of the bridge."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage


@dataclass
class BatchCounts(WriterCommitMessage):
    """What one task did (summed per batch on the driver)."""

    rows: int = 0
    transferred: int = 0
    consumed_only: int = 0
    to_dmq: int = 0
    dmq_lost: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def sum_counts(parts: Iterable[BatchCounts]) -> BatchCounts:
    total = BatchCounts()
    reasons: Counter[str] = Counter()
    for part in parts:
        total.rows += part.rows
        total.transferred += part.transferred
        total.consumed_only += part.consumed_only
        total.to_dmq += part.to_dmq
        total.dmq_lost += part.dmq_lost
        reasons.update(part.reasons)
    total.reasons = dict(reasons)
    return total
