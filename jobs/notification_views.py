"""The notifications settings page: your subscriptions to events of your jobs, a form to add one (its errors shown
inline), and deleting one. Thin: checks and writes are ``jobs.services.notifications``'s."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from .choices import NotifyChannel, NotifyEvent
from .models import NotificationSubscription
from .services.notifications import subscription_create, subscription_delete


class SubscriptionForm(forms.Form):
    channel = forms.ChoiceField(choices=NotifyChannel.choices, initial=NotifyChannel.EMAIL, label="Send by")
    events = forms.MultipleChoiceField(choices=NotifyEvent.choices, widget=forms.CheckboxSelectMultiple,
                                       label="When a job of yours", initial=[NotifyEvent.ENDED],
                                       help_text="“GPUs idle” is kept for when GPU telemetry exists: nothing sends "
                                                 "it yet.")
    email = forms.EmailField(required=False, label="Email address",
                             widget=forms.TextInput(attrs={"inputmode": "email", "autocomplete": "email"}),
                             help_text="Email: blank sends to your account's address.")
    url = forms.CharField(required=False, max_length=500, label="Webhook URL",
                          widget=forms.TextInput(attrs={"inputmode": "url", "placeholder": "https://hooks.example.com/jobs"}),
                          help_text="Webhook: a JSON POST per event (not to this machine or a private network "
                                    "unless the administrator allows the host).")
    slack = forms.BooleanField(required=False, label="Slack-compatible body ({\"text\": …})")


@login_required
@require_http_methods(["GET", "POST"])
def notifications_page(request: HttpRequest) -> HttpResponse:
    form = SubscriptionForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            subscription_create(user=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(request, "Subscribed.")
            return redirect("jobs:notifications")
    subscriptions = NotificationSubscription.objects.filter(user=request.user).order_by("id")
    labels = dict(NotifyEvent.choices)
    rows = [{"subscription": s, "events": [labels.get(e, e) for e in s.events]} for s in subscriptions]
    return render(request, "jobs/notifications.html", {
        "form": form, "rows": rows, "account_email": request.user.email,
    }, status=400 if form.errors else 200)


@login_required
@require_POST
def notification_delete_action(request: HttpRequest, pk: int) -> HttpResponse:
    if not subscription_delete(user=request.user, subscription_id=pk):
        raise Http404("No subscription of yours by that id.")
    messages.success(request, "Unsubscribed.")
    return redirect("jobs:notifications")
