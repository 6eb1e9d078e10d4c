"""The API's login: issue (``POST``) and revoke (``DELETE``) the caller's API token."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, permissions, status
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import auth
from ..schema import ErrorSerializer
from .base import ApiMixin

TOKEN_BODY = {
    "type": "object",
    "properties": {"token": {"type": "string"}, "expires_at": {"type": "string", "format": "date-time"}},
    "required": ["token", "expires_at"],
}


@extend_schema_view(
    post=extend_schema(
        summary="Get your API token",
        description="The token stays the same until it expires (`expires_at`, JOBSITE_API_TOKEN_TTL_SECONDS after "
                    "it was issued), your password changes or you revoke it; then this issues a new one. After "
                    "too many failed attempts for a username, its logins are refused for a while (429).",
        request=AuthTokenSerializer,
        responses={200: OpenApiResponse(TOKEN_BODY, description="Send it as `Authorization: Token <token>`."),
                   429: OpenApiResponse(ErrorSerializer,
                                        description="Too many failed login attempts; see Retry-After.")},
        auth=[],
    ),
    delete=extend_schema(
        summary="Revoke your API token",
        description="Deletes your token: requests with it then answer 401 (`jobctl logout`).",
        request=None,
        responses={204: None},
    ),
)
@extend_schema(tags=["auth"])
class TokenApi(ApiMixin, APIView):
    """``POST {username, password}`` → ``{"token", "expires_at"}`` (bad credentials: 400; locked: 429);
    ``DELETE`` revokes the caller's token → 204."""

    def get_permissions(self):
        if self.request.method == "POST":
            return [permissions.AllowAny()]
        return [permissions.IsAuthenticated()]

    def post(self, request: Request) -> Response:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        if isinstance(username, str) and auth.login_locked(request, username):
            wait = auth.login_lock_seconds()
            raise exceptions.Throttled(wait=wait, detail=auth.TOO_MANY_ATTEMPTS.format(wait=wait))
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        token = auth.token_issue(user=serializer.validated_data["user"])
        return Response({"token": token.key, "expires_at": auth.token_expires_at(token)})

    def delete(self, request: Request) -> Response:
        auth.token_revoke(user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
