"""The `txmq demo`: TPC-H orders as transactional messages, checked by Spark against SQLite."""
