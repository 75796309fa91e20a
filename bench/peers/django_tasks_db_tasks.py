"""The django-tasks-db side of the benchmark: a no-op and a latency task."""

from __future__ import annotations

import os
import time

from django.tasks import task


@task
def noop() -> None:
    return None


@task
def latency(tag: str) -> None:
    with open(os.environ["BENCH_LAT_FILE"], "a") as f:
        f.write(f"{tag} {time.time()}\n")
