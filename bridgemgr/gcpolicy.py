"""The service's cyclic garbage collector settings.

CPython's cyclic collector walks its youngest generation each time 700 more container
objects (dicts, lists, instances) were made than freed. A busy link keeps thousands of
messages in flight (the source's prefetch, the confirm window), each a dozen containers, so
it ran hundreds of times a second, and each pass that promoted what was in flight made the
older generations' passes walk it again. Messages are freed by reference counting, not by
this collector (they hold no cycles), so a higher threshold only lets cyclic garbage wait a
little longer. Measured with benchmarks/providers.py's AMQP link (RabbitMQ -> RabbitMQ,
50,000 persistent 1 KiB messages, our CPU per message): 46-48 us at 700, 41-43 at 10,000, 40
at 20,000, 38-39 at 50,000. What the imports made is frozen first (gc.freeze: never walked
again; it lives as long as the process anyway).
"""

from __future__ import annotations

import gc

# Net container allocations between passes over the youngest generation (CPython's: 700).
YOUNGEST_THRESHOLD = 20_000


def tune() -> None:
    """Freeze what exists now and raise the youngest generation's threshold; call it once
    the modules are imported, before the service makes its objects."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNGEST_THRESHOLD, middle, oldest)
