"""A partial index of the queued jobs not waiting behind their group's head (new, inadmissible, or pending for another
reason than BlockedByQueueHead): what a scheduling pass reads of the queues besides each group's head, so it does not
scan every pending job. Raw SQL: an index the pass needs, not a field of the model (the same on SQLite and
PostgreSQL)."""

from django.db import migrations

CREATE = (
    "CREATE INDEX job_queue_unsettled ON jobs_job (group_id) WHERE phase IN ('INADMISSIBLE', 'PENDING', 'SUBMITTED') "
    "AND NOT (phase = 'PENDING' AND reason = 'BlockedByQueueHead')"
)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0009_job_name_trgm"),  # the leaf when written; the chain wants 0008_submit_key and after
    ]

    operations = [
        migrations.RunSQL(CREATE, reverse_sql="DROP INDEX IF EXISTS job_queue_unsettled"),
    ]
