from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0005_node"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="failed_rank",
            field=models.PositiveSmallIntegerField(
                blank=True, help_text="The first replica that failed; the attempt's exit code is its.", null=True
            ),
        ),
    ]
