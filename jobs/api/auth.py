"""Logging in: API tokens that expire, end with a password change and can be revoked; failed logins limited.

- A token is valid for ``JOBSITE_API_TOKEN_TTL_SECONDS`` from when it was issued; an expired one answers 401
  saying so, and the next ``POST /api/v1/auth/token/`` issues a new one.
- Changing a user's password deletes their token (``revoke_tokens_on_password_change``, connected in
  ``jobs.apps``); ``DELETE /api/v1/auth/token/`` deletes the caller's.
- Failed logins are counted per username and client address in the cache; after
  ``JOBSITE_LOGIN_MAX_FAILURES`` within ``JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS`` every login of that username from
  that address is refused until the window ends (``LockingModelBackend``: the HTML login, the admin and the token
  endpoint alike). A successful login clears the count.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

TOO_MANY_ATTEMPTS = "Too many failed login attempts for this user; try again in {wait} seconds."

# --- failed logins --------------------------------------------------------------------------------------------


def _failures_key(request, username: str | None) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    digest = hashlib.sha256(f"{username or ''}\x00{address}".encode()).hexdigest()
    return f"jobsite:login-failures:{digest}"


def login_locked(request, username: str | None) -> bool:
    """Whether this username may not log in from this client now (too many recent failures)."""
    return (cache.get(_failures_key(request, username)) or 0) >= settings.JOBSITE_LOGIN_MAX_FAILURES


def login_lock_seconds() -> int:
    return settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS


def _login_failed(request, username: str | None) -> None:
    key = _failures_key(request, username)
    # The window starts at the first failure; later failures do not extend it.
    cache.add(key, 0, timeout=settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS)


class LockingModelBackend(ModelBackend):
    """Django's username/password check, refused while the username is locked out from this client."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if login_locked(request, username):
            raise PermissionDenied(TOO_MANY_ATTEMPTS.format(wait=login_lock_seconds()))
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            _login_failed(request, username)
        else:
            cache.delete(_failures_key(request, username))
        return user


# --- tokens ---------------------------------------------------------------------------------------------------


def token_expires_at(token: Token) -> datetime:
    return token.created + timedelta(seconds=settings.JOBSITE_API_TOKEN_TTL_SECONDS)


def _expired(token: Token) -> bool:
    return timezone.now() >= token_expires_at(token)


@transaction.atomic
def token_issue(*, user) -> Token:
    """The user's token: the current one while it is valid, else a new one."""
    token = Token.objects.select_for_update().filter(user=user).first()
    if token is not None and _expired(token):
        token.delete()
        token = None
    return token or Token.objects.create(user=user)


def token_revoke(*, user) -> int:
    """Delete the user's token; returns how many were deleted (0 or 1)."""
    deleted, _ = Token.objects.filter(user=user).delete()
    return deleted


def revoke_tokens_on_password_change(sender, instance, update_fields=None, **kwargs) -> None:
    """``pre_save`` of the user model: a new password ends the API token issued under the old one."""
    if instance.pk is None or (update_fields is not None and "password" not in update_fields):
        return
    old = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    if old is not None and old != instance.password:
        Token.objects.filter(user_id=instance.pk).delete()


class ExpiringTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, refused once the token is older than JOBSITE_API_TOKEN_TTL_SECONDS."""

    def authenticate_credentials(self, key):
        user, token = super().authenticate_credentials(key)
        if _expired(token):
            raise exceptions.AuthenticationFailed(
                "The token has expired; get a new one (POST /api/v1/auth/token/ or `jobctl login`)."
            )
        return user, token
