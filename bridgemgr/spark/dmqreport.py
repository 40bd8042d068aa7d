"""Formats of the DMQ report: table, CSV, JSON and an HTML page with charts.

`dmq report` aggregates with Spark (dmq.report) and hands the few rows it collected to this
module, which only formats them: a terminal table with a total line, CSV, JSON, and one
self-contained HTML page (inline CSS and SVG bar charts of messages by reason and by hour,
or by day past two days of hours, then the full table; no script, font or image is fetched).
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from .dmq import REPORT_KEYS, ReportRow

HEADINGS = (*REPORT_KEYS, "messages", "bytes")
MAX_HOUR_BARS = 48


def totals(rows: Sequence[ReportRow]) -> dict[str, int]:
    return {"messages": sum(r.messages for r in rows), "bytes": sum(r.bytes for r in rows)}


def _cells(row: ReportRow) -> list[str]:
    return ["-" if v is None else str(v) for v in row.as_dict().values()]


def table(rows: Sequence[ReportRow]) -> str:
    """Aligned columns, numbers on the right, a total line."""
    total = totals(rows)
    body = [_cells(r) for r in rows]
    foot = ["total", *[""] * (len(REPORT_KEYS) - 1), str(total["messages"]), str(total["bytes"])]
    widths = [max(len(c) for c in col) for col in zip(HEADINGS, *body, foot)]

    def line(cells: Iterable[str]) -> str:
        out = [c.rjust(w) if i >= len(REPORT_KEYS) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADINGS), rule, *(line(c) for c in body), rule, line(foot)]) + "\n"


def to_csv(rows: Sequence[ReportRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADINGS)
    for r in rows:
        writer.writerow(["" if v is None else v for v in r.as_dict().values()])
    return out.getvalue()


def to_json(rows: Sequence[ReportRow], source: str) -> str:
    return json.dumps({"source": source, "total": totals(rows), "rows": [r.as_dict() for r in rows]}, indent=2) + "\n"


def _bars(title: str, counts: Sequence[tuple[str, int]], colour: str) -> str:
    """A horizontal SVG bar chart, one labelled bar per entry."""
    bar, gap, label_w, chart_w = 22, 6, 230, 420
    top = max((c for _, c in counts), default=0) or 1
    height = 34 + len(counts) * (bar + gap)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{label_w + chart_w + 80}" '
        f'height="{height}" aria-label="{html.escape(title)}">',
        f'<text x="0" y="18" class="t">{html.escape(title)}</text>',
    ]
    for i, (label, count) in enumerate(counts):
        y = 30 + i * (bar + gap)
        w = max(1, round(chart_w * count / top))
        parts.append(
            f'<text x="{label_w - 8}" y="{y + bar - 7}" text-anchor="end">'
            f"{html.escape(label)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar}" fill="{colour}">'
            f"<title>{html.escape(label)}: {count}</title></rect>"
            f'<text x="{label_w + w + 6}" y="{y + bar - 7}">{count}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def to_html(rows: Sequence[ReportRow], source: str) -> str:
    """One page, nothing fetched: two bar charts and the table."""
    by_reason: Counter[str] = Counter()
    by_hour: Counter[str] = Counter()
    for r in rows:
        by_reason[r.reason] += r.messages
        by_hour[r.hour] += r.messages
    period = "hour"
    if len(by_hour) > MAX_HOUR_BARS:  # a long span: one bar a day
        by_day: Counter[str] = Counter()
        for hour, count in by_hour.items():
            by_day[hour[:10]] += count
        by_hour, period = by_day, "day"
    total = totals(rows)
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = "".join(f"<th>{h}</th>" for h in HEADINGS)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"n" if i >= len(REPORT_KEYS) else ""}">{html.escape(c)}</td>' for i, c in enumerate(_cells(r))
        )
        + "</tr>"
        for r in rows
    )
    charts = _bars("Dead messages by reason", by_reason.most_common(), "#c0392b") + _bars(
        f"Dead messages by {period} (UTC)", sorted(by_hour.items()), "#2c7fb8"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>DMQ report: {html.escape(source)}</title>
<style>
body{{font-family:sans-serif;margin:2em;color:#222}} svg{{display:block;margin:1em 0}}
svg text{{font-size:13px;font-family:sans-serif}} svg .t{{font-weight:bold;font-size:15px}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}
td.n{{text-align:right}} th{{background:#eee}}
</style></head><body>
<h1>DMQ report</h1>
<p>{html.escape(source)}: <b>{total["messages"]}</b> dead messages, <b>{total["bytes"]}</b>
bytes of original messages. Made {made}.</p>
{charts if rows else "<p>No dead messages.</p>"}
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>
<tfoot><tr><th colspan="{len(REPORT_KEYS)}">total</th><td class="n">{total["messages"]}</td>
<td class="n">{total["bytes"]}</td></tr></tfoot></table>
</body></html>
"""


def render(kind: str, rows: Sequence[ReportRow], source: str) -> str:
    """``table``, ``csv``, ``json`` or ``html``."""
    formats: dict[str, Any] = {
        "table": lambda: table(rows),
        "csv": lambda: to_csv(rows),
        "json": lambda: to_json(rows, source),
        "html": lambda: to_html(rows, source),
    }
    return formats[kind]()
