from __future__ import annotations

from django.db import models


class Execution(models.Model):
    """One call of a test handler: lets tests count side effects across processes."""

    run_id = models.BigIntegerField(db_index=True)
    job_type = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.attempt} in pid {self.pid}"
