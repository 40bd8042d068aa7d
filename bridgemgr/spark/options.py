"""A Spark link's query options and shared names, importable at no cost.

What a runner=spark link's query carries to every process Spark starts for
it (the data source's string options, LinkOptions: the options every link in a process of
its own has, jmsbridge/linkoptions.py, and Spark's own) and the names both ends share. This
module imports nothing heavy on purpose: Spark unpickles the link's reader and writer
(which hold a LinkOptions) in several short-lived Python processes on the way to the
first micro-batch (planning, the sink's commit, the log-reading tasks), one after the
other, and each would otherwise import the whole bridge (~1 s apiece). Only the processes
that connect (the driver's receiver, the executors' transfer) build a LinkEnvironment.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..jmsbridge.linkoptions import BACKOUT_THRESHOLD, LINK_WINDOW, LINK_WINDOW_BYTES, SharedLinkOptions

__all__ = [
    "BACKOUT_THRESHOLD",
    "FORMAT",
    "LINK_WINDOW",
    "LINK_WINDOW_BYTES",
    "SCHEMA",
    "SOURCE_ID_PROPERTY",
    "LinkOptions",
    "offset_slices",
]

FORMAT = "imqbridge_link"
SOURCE_ID_PROPERTY = "JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"  # stamped on every transferred message
SCHEMA = "offset long"  # a row is a message of the source log, by its offset (source.py)


@dataclass(frozen=True, kw_only=True)
class LinkOptions(SharedLinkOptions):
    """The query's options (strings on the wire), for the reader and the writer: the
    link's shared ones and the Spark link's own."""

    source_log: str  # <checkpoint>/sourcelog
    stats: str  # the per-batch counters file (JSON lines)
    parallelism: int = 2  # partitions a batch is read in (executor tasks)
    max_per_batch: int = 10000  # messages received for one micro-batch at most
    receive_wait: float = 1.0  # how long the driver waits for a batch's first message (s)
    ship_log: bool = False  # the driver ships each slice's records (slices.py)

    @property
    def prefetch(self) -> int:
        """The mq:// client's prefetch: a batch's worth, at most 1000."""
        return min(max(self.max_per_batch, 1), 1000)

    def to_options(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> LinkOptions:
        values: dict[str, Any] = {}
        lowered = {k.lower(): v for k, v in options.items()}
        for f in dataclasses.fields(cls):
            raw = lowered.get(f.name.lower())
            if raw is None:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"the {FORMAT} data source needs the option {f.name}")
                continue
            values[f.name] = _cast(f.default, raw)
        return cls(**values)


def offset_slices(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Offsets [lo, hi) cut into at most ``parts`` nearly equal [a, b) (none when empty):
    the tasks of a batch."""
    n = hi - lo
    parts = max(1, min(parts, n))
    if n <= 0:
        return []
    bounds = [lo + n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _cast(default: Any, raw: str) -> Any:
    if isinstance(default, bool):
        return raw.lower() == "true"
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw
