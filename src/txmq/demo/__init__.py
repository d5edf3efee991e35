"""The `txmq demo`: TPC-H orders as transactional messages, checked by Spark against SQLite."""

from txmq.extras import require_extra as _require_extra

_require_extra("demo", "txmq.demo", "pyspark", "sqlalchemy")
