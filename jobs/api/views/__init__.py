"""The REST API's views, one module per resource: thin views over ``jobs.selectors`` (reads) and ``jobs.services``
(writes).

Visibility: a job or group of a group the user is not in does not exist for them (404). Acting on a visible job
that is neither theirs nor in a group they administer is forbidden (403). Anonymous requests are 401. Errors all
have the shape of ``jobs.api.exceptions``.
"""

from .cluster import UsageApi, UtilisationApi
from .groups import GroupViewSet
from .jobs import JobViewSet
from .not_found import NotFoundApi
from .tokens import TokenApi
from .vocabularies import VocabulariesApi

__all__ = ["GroupViewSet", "JobViewSet", "NotFoundApi", "TokenApi", "UsageApi", "UtilisationApi", "VocabulariesApi"]
