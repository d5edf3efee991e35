"""``txmq trace``: read OTLP JSON lines files (the demo's ``traces.jsonl``, a broker's
``otlp_file``, the OpenTelemetry Collector's file exporter): ``list`` the traces, ``show`` one as
a tree in the terminal, or as an HTML timeline page (``--html``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from txmq.cli._trace_html import render_html, short_attributes
from txmq.demo.traces import SpanNode, build_tree, read_spans, summarize

__all__ = ["LIST_TRACES_DEFAULT", "list_cmd", "render_tree", "show", "trace_app"]

trace_app = typer.Typer(help="Read OTLP JSON lines trace files (e.g. a demo run's traces.jsonl).",
                        no_args_is_help=True)
LIST_TRACES_DEFAULT = 20
"""Traces ``txmq trace list`` shows unless told (the ones with the most spans)."""

_Files = Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, readable=True,
                                              help="OTLP JSON lines files.")]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f} ms"


def _label(node: SpanNode, t0: int) -> str:
    s = node.span
    name = f"[bold red]{escape(s.name)}[/]" if s.error else f"[bold]{escape(s.name)}[/]"
    attrs = " ".join(f"{escape(k)}={escape(v)}" for k, v in short_attributes(s))
    return (f"{name} [dim]{escape(s.service)} · {s.kind.lower()}[/] [cyan]+{_ms(s.start_ns - t0)}[/]"
            f" {_ms(s.duration_ns)}" + (f"  [yellow]{attrs}[/]" if attrs else ""))


def render_tree(trace_id: str, roots: list[SpanNode]) -> Tree:
    """One trace as a Rich tree: each span's name, service, kind, start (from the trace's first
    span), duration and key attributes; status ERROR in red."""
    t0 = min(n.span.start_ns for n in roots)
    top = Tree(f"trace [bold]{trace_id}[/]")

    def add(parent: Tree, node: SpanNode) -> None:
        branch = parent.add(_label(node, t0))
        for child in node.children:
            add(branch, child)

    for root in roots:
        add(top, root)
    return top


@trace_app.command("list")
def list_cmd(files: _Files, limit: Annotated[int, typer.Option(
        min=1, help="Traces to show: those with the most spans.")] = LIST_TRACES_DEFAULT) -> None:
    """List the traces of the files: root span, spans, duration, errors, services."""
    traces = sorted(summarize(read_spans(files)), key=lambda t: (-t.spans, t.start_ns))
    table = Table("trace id", "root span", "spans", "duration", "errors", "services",
                  title=f"{len(traces)} traces; the {min(limit, len(traces))} with the most spans")
    for t in traces[:limit]:
        table.add_row(t.trace_id, escape(t.root_name), str(t.spans), _ms(t.duration_ns),
                      str(t.errors), escape(", ".join(sorted(t.services))))
    Console().print(table)


@trace_app.command("show")
def show(files: _Files,
         trace_id: Annotated[str, typer.Option(help="The trace (32 hex digits).")],
         html: Annotated[Path | None, typer.Option(
             help="Write the trace as an HTML timeline page here, instead of the tree.")] = None,
         title: Annotated[str, typer.Option(
             help="The HTML page's heading (default: the root span's name).")] = "",
         ) -> None:
    """Show one trace: a tree of its spans in the terminal, or an HTML timeline page."""
    spans = list(read_spans(files, trace_id))
    if not spans:
        Console(stderr=True).print(f"[red]error:[/red] no span of trace {escape(trace_id)} in "
                                   f"{', '.join(map(str, files))}")
        raise typer.Exit(1)
    roots = build_tree(spans)
    if html is None:
        Console().print(render_tree(trace_id.lower(), roots))
        return
    html.write_text(render_html(trace_id.lower(), roots, title), encoding="utf-8")
    Console().print(f"{len(spans)} spans of trace {trace_id} → {html}", highlight=False)
