"""The chaos report: Markdown for people, JSON for machines (the same :class:`ChaosResult`)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from txmq.testing.chaos._failover_run import FailoverResult
from txmq.testing.chaos._run import ChaosResult

__all__ = ["render_failover_markdown", "render_markdown", "write_reports"]


def _table(head: list[str], rows: list[list[object]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def render_markdown(res: ChaosResult) -> str:
    """The report: seed, verdict, counts, fault schedule, and each violation with its excerpt."""
    t0 = min((f.started_ms for f in res.schedule if f.started_ms), default=0.0)
    cluster = f" --brokers {res.config.brokers}" if res.config.brokers > 1 else ""
    cluster += " --replicas 1" if res.config.replicas else ""
    lines = [f"# Chaos run, seed {res.seed}", "",
             f"- verdict: **{'PASS' if not res.violations else 'FAIL'}** — {len(res.violations)} "
             f"violations; replay with `txmq chaos --seed {res.seed} --faults {res.config.faults} "
             f"--duration-s {res.config.duration_s:g}{cluster}`",
             f"- faults injected: {sum(res.faults_by_kind.values())} of {len(res.schedule)} scheduled; "
             f"elapsed {res.elapsed_s} s; drained after healing: {res.quiesced}",
             f"- messages in the broker at the end: {res.stored} (and {res.retained_out} delivered "
             f"ones deleted by retention under a full disk); transactions by broker state: "
             f"{res.tx_states}",
             f"- consumer offsets sampled: {res.offset_samples} times; redeliveries absorbed by the "
             f"inbox: {res.redeliveries}"]
    if res.stored_by_broker:
        lines.append(f"- a cluster of {res.config.brokers} brokers; messages stored by each: "
                     f"{res.stored_by_broker}")
    if res.replica:
        lines.append(f"- a SYNC_MASTER and its slave: the slave scanned {res.replica['snapshots']} "
                     f"times (while the master was down, and at the end), holding "
                     f"{res.replica['stored']} messages at the end; commit logs at the end: slave "
                     f"{res.replica['log_bytes']} bytes, master {res.replica['master_log_bytes']}")
    lines += [f"- fault kind `{k}` skipped: {why}" for k, why in res.skipped_kinds.items()]
    lines += [f"- note: {n}" for n in res.notes]
    lines += ["", "## Faults by kind", "",
              *_table(["kind", "injected"], [[k, n] for k, n in sorted(res.faults_by_kind.items())])]
    lines += ["", "## Operations", "",
              *_table(["operation", "result", "count"],
                      [[*k.split(" ", 1), n] for k, n in res.operations.items()])]
    lines += ["", "## Fault schedule", "",
              *_table(["at (s)", "fault", "target", "duration (s)", "amount (ms)", "note"],
                      [[f"{(f.started_ms - t0) / 1000:.1f}" if f.started_ms else f"({f.at_s:.1f})",
                        f.kind, f.target, f"{f.duration_s:.2f}", f.amount_ms or "", f.note]
                       for f in res.schedule])]
    lines += ["", "## Violations", ""]
    if not res.violations:
        lines.append("None.")
    for v in res.violations:
        lines += [f"### {v.kind}: `{v.key}`", "", v.detail, "", "```"]
        lines += [json.dumps(e, separators=(",", ":")) for e in v.excerpt]
        lines += ["```", ""]
    return "\n".join(lines) + "\n"


def write_reports(res: ChaosResult | FailoverResult, markdown: Path | None,
                  json_path: Path | None) -> None:
    """Write the Markdown and/or JSON report."""
    if markdown is not None:
        text = render_markdown(res) if isinstance(res, ChaosResult) else render_failover_markdown(res)
        markdown.write_text(text, encoding="utf-8")
    if json_path is not None:
        json_path.write_bytes(msgspec.json.format(msgspec.json.encode(res)))


def render_failover_markdown(res: FailoverResult) -> str:
    """A failover run's report: verdict, failover times, downtime per fault window, schedule and
    violations."""
    c = res.config
    s = res.failover_summary
    lines = [f"# Failover chaos run, seed {c.seed}", "",
             f"- verdict: **{'PASS' if not res.violations else 'FAIL'}** — {len(res.violations)} "
             f"violations; replay with `txmq chaos --cluster --seed {c.seed} --faults {c.faults} "
             f"--duration-s {c.duration_s:g}`",
             f"- cluster: {c.spec.controllers} controllers, {c.spec.groups} groups of "
             f"{c.spec.brokers_per_group} brokers, {c.spec.clients} client hosts",
             f"- failover (master SIGKILL → first send acknowledged by another broker): "
             f"{s['failed_over']} of {s['kills']} kills; median {s['median_ms']} ms, max "
             f"{s['max_ms']} ms",
             f"- restarted old master took its role back before an election: "
             f"{s.get('reinstated', 0)} kills; write outage (master SIGKILL → first send of its "
             f"group acknowledged by any broker): median {s.get('restored_median_ms')} ms, max "
             f"{s.get('restored_max_ms')} ms", *(f"- note: {n}" for n in res.notes), "", "## Operations", "",
             *_table(["operation", "result", "count"],
                     [[*k.split(" ", 1), n] for k, n in sorted(res.operations.items())]),
             "", "## Downtime per fault window (OpenChaos RTOChecker)", "",
             *_table(["fault", "window (s)", "downtime (ms)", "recovered"],
                     [[d.kind, f"{(d.end_ms - d.start_ms) / 1000:.1f}", f"{d.downtime_ms:.0f}",
                       d.recovered] for d in res.downtime]),
             "", "## Fault schedule", "",
             *_table(["at (s)", "fault", "target", "duration (s)", "note"],
                     [[f"{f.at_s:.1f}", f.kind, f.target, f"{f.duration_s:.2f}", f.note]
                      for f in res.schedule]),
             "", "## Violations", ""]
    if not res.violations:
        lines.append("None.")
    for v in res.violations:
        lines += [f"### {v.kind}: `{v.key}`", "", v.detail, "", "```"]
        lines += [json.dumps(e, separators=(",", ":")) for e in v.excerpt]
        lines += ["```", ""]
    return "\n".join(lines) + "\n"
