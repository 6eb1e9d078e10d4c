from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_attempt_failed_rank"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="estimated_start",
            field=models.DateTimeField(
                blank=True,
                help_text="Pending: when the scheduler expects it to start (empty: not within 30 days).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="estimate_basis",
            field=models.CharField(
                blank=True,
                help_text="What the estimate assumes: 'deadlines' (every job runs to its deadline) or 'history' (jobs "
                "run as long as similar recent ones did).",
                max_length=10,
            ),
        ),
    ]
