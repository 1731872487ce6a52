"""podium.rdma: one-sided transfers between procs over UCX, as Monarch's ``monarch.rdma``
(docs/data.md)."""

from podium._src.rdma import (
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
    RDMAAction,
    RDMABuffer,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMAWriteTransferWarning,
)

__all__ = [
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
    "RDMABuffer",
    "RDMAAction",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
]
