from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import pre_save

        from jobs.api.auth import revoke_tokens_on_password_change
        from jobs.services.submit_lookups import connect_signals

        # A changed password ends the API token issued under the old one.
        pre_save.connect(revoke_tokens_on_password_change, sender=settings.AUTH_USER_MODEL,
                         dispatch_uid="jobs.revoke_tokens_on_password_change")
        # What a submit is checked against is kept in memory; a change of it is seen by the next submit.
        connect_signals()
