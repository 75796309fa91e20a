"""Exceptions raised by django_jobs: one base class, then the specific errors."""

from __future__ import annotations


class JobsError(Exception):
    """Base class of every error django_jobs raises on purpose."""


class UnknownJobType(JobsError, LookupError):
    """No handler is registered under this job type."""


class DuplicateJobType(JobsError):
    """Two different handlers were registered under one job type."""


class InvalidJobInput(JobsError, ValueError):
    """Input, output or an option of a run is not acceptable (not JSON, too large, ...)."""


class RunNotFound(JobsError, LookupError):
    """No run has this id (within the given tenant)."""


class InvalidTransition(JobsError):
    """The run is not in a state that allows the requested change."""
