"""Errors of the sidecar index: every message names the file it concerns and what to do."""

from __future__ import annotations

from ..errors import LeRobotNodesError


class SidecarError(LeRobotNodesError):
    """A sidecar archive or derived index cannot be built, read or used."""


class SidecarFormatError(SidecarError, ValueError):
    """An archive or derived index file is malformed, truncated or of an unknown layout."""


class SidecarLockTimeoutError(SidecarError, TimeoutError):
    """Another process held a sidecar lock longer than the lock timeout."""


class PublishNotSupportedError(SidecarError):
    """Publishing a sidecar (``--push``) was asked for but is not possible here."""
