"""JobContext: what a handler sees of its run."""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from .claims import Claim
from .models import JobRun, Status

logger = logging.getLogger("django_jobs.job")


class RunLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefix a handler's log lines with its run id and job type."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        assert self.extra is not None
        return f"run={self.extra['run_id']} type={self.extra['job_type']} {msg}", kwargs


class JobContext:
    """The handler's view of one attempt of one run."""

    def __init__(self, claim: Claim) -> None:
        self._claim = claim
        self.input: Any = claim.row["input"]
        self.attempt: int = claim.attempt
        self.logger = RunLogger(logger, {"run_id": claim.run_id, "job_type": claim.row["job_type"]})

    @property
    def run_id(self) -> int:
        return self._claim.run_id

    @property
    def job_type(self) -> str:
        return str(self._claim.row["job_type"])

    @cached_property
    def run(self) -> JobRun:
        """The run as claimed (built from the claimed row, without a query)."""
        return JobRun(
            **self._claim.row,
            status=Status.RUNNING,
            lease_token=self._claim.lease_token,
        )

    def __repr__(self) -> str:
        return f"<JobContext run={self.run_id} type={self.job_type} attempt={self.attempt}>"
