"""What the notifications resource reads and shows: a subscription to events of your jobs, by email or webhook."""

from __future__ import annotations

from rest_framework import serializers

from jobs.choices import NotifyChannel, NotifyEvent


class SubscriptionSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    channel = serializers.ChoiceField(choices=NotifyChannel.choices)
    url = serializers.CharField(required=False, allow_blank=True, default="", max_length=500,
                                help_text="Webhook: where the JSON is POSTed (http or https; not this machine or a "
                                          "private network unless the administrator allows the host).")
    email = serializers.EmailField(required=False, allow_blank=True, default="",
                                   help_text="Email: where to send; blank: your account's address.")
    slack = serializers.BooleanField(required=False, default=False,
                                     help_text='Webhook: a Slack-compatible body, {"text": "..."}.')
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=NotifyEvent.choices), allow_empty=False,
        help_text="ended (any way), succeeded, failed (failed or timed out), running (started after a wait), "
                  "idle_gpus (stored; sent once GPU telemetry exists).")
    created_at = serializers.DateTimeField(read_only=True)
