"""The `txmq demo`: TPC-H orders as transactional messages, checked by Spark against SQLite.

Its modules need the ``demo`` extra (``pip install 'txmq[demo]'``) and check for it when imported
(:mod:`~txmq.demo.tpch`, :mod:`~txmq.demo.spark_pipeline`, :mod:`~txmq.demo.ledger`), except
:mod:`txmq.demo.traces`, whose reading of OTLP JSON lines files (``txmq trace``) needs nothing
beyond the core.
"""
