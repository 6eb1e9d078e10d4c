"""Logging in: API tokens that expire, end with a password change and can be revoked; failed logins limited.

- A token is valid for ``JOBSITE_API_TOKEN_TTL_SECONDS`` from when it was issued; an expired one answers 401
  saying so, and the next ``POST /api/v1/auth/token/`` issues a new one.
- Changing a user's password deletes their token (``revoke_tokens_on_password_change``, connected in
  ``jobs.apps``); ``DELETE /api/v1/auth/token/`` deletes the caller's.
- Failed logins are counted per username and client address; after ``JOBSITE_LOGIN_MAX_FAILURES`` within
  ``JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS`` every login of that username from that address is refused until the
  window ends (``LockingModelBackend``: the HTML login, the admin and the token endpoint alike). A successful login
  clears the count.

Where the counts live decides who can tamper with them. They used to be cache keys in Redis, and anything that
could reach Redis (a job, before jobs lost the network) read them, deleted its own (unlimited guessing) and set
another user's to 1000 (a lockout). They are now rows of the database (``LoginFailure``): PostgreSQL in production,
written only through jobsite's own role (a password of the installation, ``jobsite.provision``), with no copy and
no fallback in Redis, so no Redis client, authenticated or not, can reset or raise them. Each row is keyed by an
HMAC of the username and the address under ``SECRET_KEY`` (``_failures_key``), so the table tells a reader neither,
and a row cannot be guessed or forged for a chosen user without the key. A failure is one locked upsert (concurrent
failures all count); expired rows are deleted as later failures come in.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext_lazy
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from ..models import LoginFailure
from ..prepared import Prepared

TOO_MANY_ATTEMPTS = "Too many failed login attempts for this user; try again in {wait} seconds."

# --- failed logins --------------------------------------------------------------------------------------------


def _failures_key(request, username: str | None) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    return salted_hmac("jobsite.login-failures", f"{username or ''}\x00{address}", algorithm="sha256").hexdigest()


def login_locked(request, username: str | None) -> bool:
    """Whether this username may not log in from this client now (too many recent failures)."""
    return LoginFailure.objects.filter(key=_failures_key(request, username), window_ends_at__gt=timezone.now(),
                                       failures__gte=settings.JOBSITE_LOGIN_MAX_FAILURES).exists()


def login_lock_seconds() -> int:
    return settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS


def _login_failed(request, username: str | None) -> None:
    """Count one failure: a new window starts at the first failure (or the first after the last window ended);
    later failures within it do not extend it."""
    key, now = _failures_key(request, username), timezone.now()
    window_ends_at = now + timedelta(seconds=settings.JOBSITE_LOGIN_FAILURE_WINDOW_SECONDS)
    LoginFailure.objects.filter(window_ends_at__lte=now).exclude(key=key).delete()  # expired windows
    for _ in range(2):  # a concurrent first failure may insert the row between our read and our insert
        try:
            with transaction.atomic():
                row = LoginFailure.objects.select_for_update().filter(key=key).first()
                if row is None:
                    LoginFailure.objects.create(key=key, failures=1, window_ends_at=window_ends_at)
                elif row.window_ends_at <= now:
                    LoginFailure.objects.filter(pk=row.pk).update(failures=1, window_ends_at=window_ends_at)
                else:
                    LoginFailure.objects.filter(pk=row.pk).update(failures=F("failures") + 1)
            return
        except IntegrityError:
            continue


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
            LoginFailure.objects.filter(key=_failures_key(request, username)).delete()
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


TOKEN_WITH_USER = Prepared(lambda key: Token.objects.select_related("user").filter(key=key), key=str)


class ExpiringTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>``, refused once the token is older than JOBSITE_API_TOKEN_TTL_SECONDS."""

    def authenticate_credentials(self, key):
        # DRF's own lookup and messages (its translations), the token read from SQL compiled once: every API
        # request reads it.
        try:
            token = TOKEN_WITH_USER.get(key=key)
        except Token.DoesNotExist:
            raise exceptions.AuthenticationFailed(gettext_lazy("Invalid token.")) from None
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(gettext_lazy("User inactive or deleted."))
        user = token.user
        if _expired(token):
            raise exceptions.AuthenticationFailed(
                "The token has expired; get a new one (POST /api/v1/auth/token/ or `jobctl login`)."
            )
        return user, token
