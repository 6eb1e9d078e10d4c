"""The status vocabularies resource: our phases and statuses in the words of other schedulers, and back."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import vocabularies

from ..serializers.vocabularies import VocabulariesSerializer
from .base import ApiMixin


class VocabulariesApi(ApiMixin, APIView):
    """The table of our statuses in each vocabulary (`rows`), and their statuses back to our phases (`reverse`)."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(tags=["jobs"], summary="The status vocabularies: ours to Run:ai, Kueue/jobq, mcli, ModelArts, "
                                          "PrimeHub and back", responses={200: VocabulariesSerializer})
    def get(self, request: Request) -> Response:
        rows = [
            {"phase": r.phase.value, "status": r.status, "runai": r.runai, "kueue": r.kueue, "mcli": r.mcli,
             "modelarts": r.modelarts, "modelarts_name": vocabularies.MODELARTS_CODES[r.modelarts],
             "primehub": r.primehub, "note": r.note}
            for r in vocabularies.ROWS
        ]
        reverse_table = {
            name: {str(k): phase.value for k, phase in table.items()} for name, table in vocabularies.REVERSE.items()
        }
        return Response(VocabulariesSerializer({
            "vocabularies": vocabularies.VOCABULARIES, "aliases": vocabularies.ALIASES, "rows": rows,
            "reverse": reverse_table,
        }).data)
