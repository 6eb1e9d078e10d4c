"""The API's serializers, one module per resource: type checks of what clients send (the rules live in
``jobs.services``) and what they get back. No serializer writes.

The names are gathered here too, so ``from jobs.api.serializers import JobSubmitSerializer`` keeps working.
"""

from .cluster import (
    GroupUtilisationSerializer,
    NodeSerializer,
    UsageRowSerializer,
    UsageSerializer,
    UserUtilisationSerializer,
    UtilisationSerializer,
)
from .fields import (
    EnvField,
    PriorityField,
    ResourceAmountsSerializer,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)
from .groups import (
    GroupDetailSerializer,
    GroupSerializer,
    ImageSerializer,
    InstanceTypeSerializer,
    QueueEntrySerializer,
    QuotaSerializer,
    UserUsageSerializer,
)
from .job_writes import (
    BULK_MAX,
    BulkCancelResponseSerializer,
    BulkCancelResultSerializer,
    BulkCancelSerializer,
    JobCloneSerializer,
    JobSubmitSerializer,
)
from .jobs import (
    VOCABULARY_FIELDS,
    AttemptDetailSerializer,
    AttemptSerializer,
    EventSerializer,
    JobDetailSerializer,
    JobListSerializer,
    JobSerializer,
    ReplicaLogSerializer,
)
from .vocabularies import VocabulariesSerializer, VocabularyRowSerializer

__all__ = [
    "BULK_MAX", "VOCABULARY_FIELDS", "AttemptDetailSerializer", "AttemptSerializer", "BulkCancelResponseSerializer",
    "BulkCancelResultSerializer", "BulkCancelSerializer", "EnvField", "EventSerializer", "GroupDetailSerializer",
    "GroupSerializer", "GroupUtilisationSerializer", "ImageSerializer", "InstanceTypeSerializer",
    "JobCloneSerializer", "JobDetailSerializer", "JobListSerializer", "JobSerializer", "JobSubmitSerializer",
    "NodeSerializer", "PriorityField", "QueueEntrySerializer", "QuotaSerializer", "ReplicaLogSerializer",
    "ResourceAmountsSerializer", "StrictBooleanField", "StrictCharField", "StrictIntegerField", "StrictSerializer",
    "UsageRowSerializer", "UsageSerializer", "UserUsageSerializer", "UserUtilisationSerializer",
    "UtilisationSerializer", "VocabulariesSerializer", "VocabularyRowSerializer",
]
