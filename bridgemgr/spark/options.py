# How it works: what a runner=spark link's query carries to every process Spark starts for
# it (the data source's string options, LinkOptions) and the names both ends share. This
# module imports nothing heavy on purpose: Spark unpickles the link's reader and writer
# (which hold a LinkOptions) in several short-lived Python processes on the way to the
# first micro-batch (planning, the sink's commit, the log-reading tasks), one after the
# other, and each would otherwise import the whole bridge (~1 s apiece). Only the processes
# that connect (the driver's receiver, the executors' transfer) build a LinkEnvironment.
"""A Spark link's query options and shared names, importable at no cost."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT = "imqbridge_link"
SOURCE_ID_PROPERTY = "JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"  # stamped on every transferred message
SCHEMA = "offset long"  # a row is a message of the source log, by its offset (source.py)
# props.BACKOUT_THRESHOLD, repeated so that this module stays light (test_props checks it)
BACKOUT_THRESHOLD = 5
# props.LINK_WINDOW, likewise
LINK_WINDOW = 1000
# props.LINK_WINDOW_BYTES, likewise
LINK_WINDOW_BYTES = 16 * 1024 ** 2


@dataclass(frozen=True)
class LinkOptions:
    """The query's options (strings on the wire), for the reader and the writer."""

    xmlurl: str                      # the bridge XML (absolute path or URL)
    bridge: str
    link: str
    broker_url: str                  # the host broker's jms service (mq:// or mqtcp://)
    source_log: str                  # <checkpoint>/sourcelog
    stats: str                       # the per-batch counters file (JSON lines)
    parallelism: int = 2             # partitions a batch is read in (executor tasks)
    max_per_batch: int = 10000       # messages received for one micro-batch at most
    receive_wait: float = 1.0        # how long the driver waits for a batch's first message (s)
    backout_threshold: int = BACKOUT_THRESHOLD
    transformer_path: str = ""       # os.pathsep-separated transformer folders ("" = default)
    send_window: int = 256           # unconfirmed persistent sends per executor session
    window: int = LINK_WINDOW        # the link's confirm window (imq.bridge.<name>.link.window)
    window_bytes: int = LINK_WINDOW_BYTES  # ... full at this many record bytes too (-1: no bound)
    broker_user: str = ""            # for host-broker factories without a username: the
    broker_password: str = ""        # service account (an option named *password* is redacted by Spark)
    dmq_secret: str = ""             # the DMQ marker key, hex (*secret*: redacted too); "": no marker
    ship_log: bool = False           # the driver ships each slice's records (slices.py)

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
