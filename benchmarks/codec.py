"""Message codec speed; prints one JSON object.

    .venv/bin/python benchmarks/codec.py [--seconds S]

Workloads (each message as a broker would store it: message id, destination,
timestamp and 3 properties):
- text_1k: a TextMessage with 1 KiB of text;
- bytes_1k: a BytesMessage with 1 KiB of bytes;
- map_20: a MapMessage with 20 entries of mixed types;
- object_wrapping_message: an ObjectMessage whose body is the text_1k message (as the
  DMQ stores an undeliverable message).
For each: encode and decode ops/s and µs/op (best of 5 timed runs, to dampen noise
from other processes), and the blob size. Peak memory: tracemalloc's peak while
encoding and decoding each message 1,000 times, and the process's max RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import timeit
import tracemalloc

from bridgemgr.jms import BytesMessage, MapMessage, Message, ObjectMessage, Queue, TextMessage
from bridgemgr.jms.codec import FORMAT_VERSION, decode, encode


def _stamp(m: Message) -> Message:
    m.message_id = "ID:7-127.0.0.1(c4:3e:0a:11:22:33)-52368-1700000000000"
    m.destination = Queue("orders")
    m.timestamp = 1_700_000_000_000
    m.set_string_property("JMS_SUN_JMSBRIDGE_NAME", "bridge1")
    m.set_int_property("attempt", 3)
    m.set_boolean_property("urgent", True)
    return m


def workloads() -> dict[str, Message]:
    text = _stamp(TextMessage("x" * 1024))
    entries = MapMessage()
    for i in range(20):
        kind = i % 4
        if kind == 0:
            entries.set_string(f"field{i}", f"value {i}")
        elif kind == 1:
            entries.set_int(f"field{i}", i * 1000)
        elif kind == 2:
            entries.set_double(f"field{i}", i / 7)
        else:
            entries.set_boolean(f"field{i}", bool(i % 2))
    return {
        "text_1k": text,
        "bytes_1k": _stamp(BytesMessage(bytes(range(256)) * 4)),
        "map_20": _stamp(entries),
        "object_wrapping_message": _stamp(ObjectMessage(text.copy())),
    }


def _per_op(fn, seconds: float) -> float:
    """Seconds per call: best of 5 runs of about ``seconds / 5`` each."""
    number = max(1, int(seconds / 5 / max(timeit.timeit(fn, number=200) / 200, 1e-9)))
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def measure(message: Message, seconds: float) -> dict:
    blob = encode(message)
    assert decode(blob) == message
    result: dict = {"blob_bytes": len(blob)}
    for op, fn in (("encode", lambda: encode(message)), ("decode", lambda: decode(blob))):
        per = _per_op(fn, seconds)
        result[op] = {"ops_per_s": round(1 / per), "us_per_op": round(per * 1e6, 3)}
    tracemalloc.start()
    for _ in range(1000):
        decode(encode(message))
    result["tracemalloc_peak_kib"] = round(tracemalloc.get_traced_memory()[1] / 1024, 1)
    tracemalloc.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="timing budget per operation")
    args = parser.parse_args()
    report = {"format_version": FORMAT_VERSION}
    report.update({name: measure(m, args.seconds) for name, m in workloads().items()})
    report["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(report))


if __name__ == "__main__":
    main()
