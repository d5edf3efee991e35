"""txmq's Alembic revisions of the outbox and inbox tables (branch label ``txmq_outbox``)."""
