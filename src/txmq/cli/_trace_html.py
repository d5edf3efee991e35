"""One trace as a self-contained HTML timeline page (``txmq trace show --html``): a row per span,
indented under its parent, with a bar from its start to its end on the trace's time axis,
coloured by service (red: status ERROR), its attributes in the row's tooltip. No script, no
external file: the page opens anywhere, and a browser screenshot of it is the README's picture.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from typing import Final

from txmq.demo.traces import SpanNode, SpanRecord

__all__ = ["AXIS_TICKS", "PALETTE", "render_html", "short_attributes"]

PALETTE: Final = ("#2f6fdb", "#1a9c74", "#c2781b", "#8a4fd1", "#0f8fb3", "#b8487a", "#6a7a12")
"""Bar colours, one per service in order of first appearance (then again)."""
ERROR_COLOUR: Final = "#d33a2f"
AXIS_TICKS: Final = 8
"""Time axis divisions."""
LABEL_FLIP_PERCENT: Final = 88.0
"""A bar ending right of this (% of the lane) has its duration written before it."""
_KEY_ATTRIBUTES: Final = (
    ("messaging.rocketmq.transaction.state", "state"),
    ("messaging.rocketmq.transaction.outcome", "outcome"),
    ("messaging.rocketmq.transaction.check_times", "check"),
    ("messaging.rocketmq.message.reconsume_times", "reconsume"),
    ("txmq.outbox.delivery", "delivery"),
    ("txmq.outbox.parked_ms", "parked ms"),
    ("txmq.inbox.outcome", "inbox"),
    ("error.type", "error"),
)
"""Attributes worth a glance, shown beside a span's name: (attribute, label)."""


def short_attributes(span: SpanRecord) -> list[tuple[str, str]]:
    """``(label, value)`` of the span's :data:`_KEY_ATTRIBUTES` it has."""
    return [(label, str(span.attributes[k])) for k, label in _KEY_ATTRIBUTES if k in span.attributes]


def _walk(nodes: Sequence[SpanNode], prefix: str = "",
          top: bool = True) -> Iterator[tuple[str, SpanRecord]]:
    """Each span depth-first, with its tree guide (``├─``, ``└─`` after the ancestors' ``│``)."""
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        yield ("" if top else prefix + ("└─" if last else "├─")), node.span
        yield from _walk(node.children, "" if top else prefix + ("  " if last else "│ "), False)


def _ms(ns: int) -> str:
    ms = ns / 1e6
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


_CSS: Final = """
body{font:13px/1.35 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:18px 22px;
 color:#1d2330;background:#fff}
h1{font-size:17px;margin:0 0 4px}.meta{color:#5a6275;margin-bottom:10px}
.legend span{display:inline-block;margin-right:14px}
.dot{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;width:100%;table-layout:fixed}
td{padding:0;height:21px;border-bottom:1px solid #eef0f4;vertical-align:middle;white-space:nowrap}
td.label{width:42%;overflow:hidden;text-overflow:ellipsis;padding-right:8px}
td.lane{position:relative}
.bar{position:absolute;top:4px;height:13px;border-radius:3px;min-width:2px}
.dur{position:absolute;top:3px;font-size:11px;color:#5a6275}
.kind{font-size:10px;color:#8a91a3;margin-left:4px}.attr{font-size:11px;color:#5a6275;margin-left:6px}
.err{color:#d33a2f;font-weight:600}
.guide{color:#b5bbc8;font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre;margin-right:3px}
th{font-weight:400;color:#8a91a3;font-size:11px;text-align:left;height:18px;border-bottom:1px solid #d5d9e2}
th.lane{position:relative}.tick{position:absolute;top:2px;white-space:nowrap}
.grid{position:absolute;top:0;bottom:0;border-left:1px dashed #eef0f4}
"""


def _axis(total_ns: int) -> str:
    ticks = []
    for i in range(AXIS_TICKS + 1):
        shift = "none" if i == 0 else "translateX(-100%)" if i == AXIS_TICKS else "translateX(-50%)"
        ticks.append(f'<span class="tick" style="left:{100 * i / AXIS_TICKS:.2f}%;transform:{shift}">'
                     f'{_ms(total_ns * i // AXIS_TICKS)}</span>')
    return "".join(ticks)


def _row(guide: str, s: SpanRecord, t0: int, total: int, colour: str) -> str:
    left = 100 * (s.start_ns - t0) / total
    width = 100 * s.duration_ns / total
    attrs = "".join(f'<span class="attr">{html.escape(k)}={html.escape(v)}</span>'
                    for k, v in short_attributes(s))
    tooltip = html.escape("\n".join([f"{s.name} ({s.service}, {s.kind})",
                                     f"start +{_ms(s.start_ns - t0)}, {_ms(s.duration_ns)}",
                                     *(f"{k} = {v}" for k, v in sorted(s.attributes.items()))]))
    name = f'<span class="err">{html.escape(s.name)}</span>' if s.error else html.escape(s.name)
    end = left + width
    place = (f"right:calc({100 - left:.3f}% + 4px)" if end > LABEL_FLIP_PERCENT
             else f"left:calc({end:.3f}% + 4px)")  # near the right edge: before the bar
    return (f'<tr title="{tooltip}"><td class="label"><span class="guide">{guide}</span>'
            f'<span class="dot" style="background:{colour}"></span>{name}'
            f'<span class="kind">{s.kind.lower()}</span>{attrs}</td>'
            f'<td class="lane"><div class="bar" style="left:{left:.3f}%;width:{width:.3f}%;'
            f'background:{ERROR_COLOUR if s.error else colour}"></div>'
            f'<span class="dur" style="{place}">{_ms(s.duration_ns)}</span></td></tr>')


def render_html(trace_id: str, roots: Sequence[SpanNode], title: str = "") -> str:
    """The timeline page of one trace's tree (``roots``: :func:`txmq.demo.traces.build_tree`),
    headed ``title`` (default: the first root span's name).

    Raises:
        ValueError: an empty trace.
    """
    rows = list(_walk(roots))
    if not rows:
        raise ValueError(f"trace {trace_id} has no spans")
    t0 = min(s.start_ns for _, s in rows)
    total = max(1, max(s.end_ns for _, s in rows) - t0)
    colours: dict[str, str] = {}
    for _, s in rows:
        colours.setdefault(s.service, PALETTE[len(colours) % len(PALETTE)])
    grid = "".join(f'<div class="grid" style="left:{100 * i / AXIS_TICKS:.2f}%"></div>'
                   for i in range(1, AXIS_TICKS))
    body = "".join(_row(g, s, t0, total, colours[s.service]) for g, s in rows)
    legend = "".join(f'<span><span class="dot" style="background:{c}"></span>{html.escape(svc or "?")}'
                     f'</span>' for svc, c in colours.items())
    errors = sum(s.error for _, s in rows)
    heading = html.escape(title or rows[0][1].name)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{heading}</title>'
            f'<style>{_CSS}</style></head><body><h1>{heading}</h1>'
            f'<div class="meta">trace {html.escape(trace_id)} · {len(rows)} spans · {_ms(total)}'
            f' · {errors} with errors</div><div class="legend meta">{legend}</div>'
            f'<table><tr><th class="label">span</th><th class="lane">{grid}{_axis(total)}</th></tr>'
            f'{body}</table></body></html>\n')
