"""``txmq reconcile``: a service's database against a topic (Spark underneath)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table


def reconcile(
    db: Annotated[str, typer.Option(help="SQLAlchemy URL of the service's database.")],
    table: Annotated[str, typer.Option(help="Table holding the business rows.")],
    key_column: Annotated[str, typer.Option(help="Column whose value is the message key.")],
    topic: Annotated[str, typer.Option(help="Topic to compare with.")],
    endpoints: Annotated[str | None, typer.Option(
        help="Broker host:port (default 127.0.0.1:10911 without a name server).")] = None,
    namesrv_addr: Annotated[str, typer.Option(
        help="Name servers host:port[;host:port]: the topic is read on every broker group of its "
             "route (a cluster).")] = "",
    where: Annotated[str, typer.Option(help="SQL condition selecting the rows that must be "
                                            "published (e.g. 'cancelled = 0').")] = "",
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the report here.")] = None,
) -> None:
    """Report missing, phantom and duplicated messages; exit 1 when there are any."""
    from txmq.spark import spark_session
    from txmq.spark.reconcile import reconcile as run

    spark = spark_session("txmq-reconcile")
    try:
        report = run(spark, endpoints=endpoints or ("" if namesrv_addr else "127.0.0.1:10911"),
                     namesrv_addr=namesrv_addr, topic=topic, db_url=db, table=table,
                     key_column=key_column, where=where)
    finally:
        spark.stop()
    data = msgspec.to_builtins(report)
    data["consistent"] = report.consistent
    table_ = Table("measure", "value", title=f"reconcile {table}.{key_column} ↔ topic {topic}")
    for k in ("db_keys", "topic_messages", "missing", "phantom", "duplicated"):
        table_.add_row(k, str(data[k]))
    for k in ("missing_sample", "phantom_sample", "duplicated_sample"):
        if data[k]:
            table_.add_row(k, ", ".join(data[k]))
    Console().print(table_)
    if json_path is not None:
        json_path.write_text(json.dumps(data, indent=2) + "\n")
    if not report.consistent:
        raise typer.Exit(1)
