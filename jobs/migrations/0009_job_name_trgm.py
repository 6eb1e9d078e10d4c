"""The job list at a million jobs, on PostgreSQL (nothing on SQLite):

- a trigram index for the name search (``?q=``). The search is ``name__icontains``, which PostgreSQL runs as
  ``UPPER(name::text) LIKE UPPER('%…%')``: the GIN index is on that expression, with ``pg_trgm``'s operator class,
  so a substring match reads the index instead of every row;
- statistics of group and phase together, so the planner knows when a group has few jobs in a phase and reads
  the (group, phase, id) index instead of walking every job newest first looking for them.
"""

from django.db import migrations

INDEX = "job_name_trgm"
STATISTICS = "job_group_phase_stats"


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {INDEX} ON jobs_job USING gin ((UPPER(name::text)) gin_trgm_ops)"
    )
    schema_editor.execute(f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} (mcv) ON group_id, phase FROM jobs_job")


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0008_submit_key"),
    ]

    operations = [
        migrations.RunPython(create_index, drop_index, elidable=False),
    ]
