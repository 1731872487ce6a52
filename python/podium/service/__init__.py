"""podium.service: replicated actors with load-balanced calls, as TorchForge's services
(docs/services.md). ``MyActor.options(procs=P, num_replicas=R).as_service(*args)`` starts
one; ``RestartPolicy`` also goes to ``ProcMesh.spawn(..., restart=...)``."""

from podium._src.restart import RestartingActorMesh, RestartingError, RestartPolicy
from podium._src.service import (
    no_retry,
    Service,
    ServiceEndpoint,
    ServiceError,
    ServiceOptions,
)

__all__ = [
    "no_retry",
    "RestartingActorMesh",
    "RestartingError",
    "RestartPolicy",
    "Service",
    "ServiceEndpoint",
    "ServiceError",
    "ServiceOptions",
]
