"""Read the demo's runs back: progress counts and the final summary table."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Max, Min, Sum
from django.utils import timezone

from django_jobs.models import FINISHED_STATUSES, Status

from .orders import EXPRESS_PRIORITY, demo_runs

# Statuses in the order a reader expects them, every one of them.
STATUS_ORDER = [str(status) for status in Status.values]


@dataclass(frozen=True)
class Progress:
    """How many of the demo's runs are in each status."""

    counts: Counter[str]

    @classmethod
    def read(cls) -> Progress:
        rows = demo_runs().values("status").annotate(n=Count("id")).order_by()
        return cls(Counter({row["status"]: row["n"] for row in rows}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in FINISHED_STATUSES)

    @property
    def unfinished(self) -> int:
        return self.total - self.finished

    def bar(self, width: int = 30) -> str:
        """Return e.g. ``[#########.....] 150/300  completed=140 failed=2 running=8``."""
        done = width * self.finished // self.total if self.total else width
        detail = " ".join(f"{s}={self.counts[s]}" for s in STATUS_ORDER if self.counts[s])
        return f"[{'#' * done}{'.' * (width - done)}] {self.finished}/{self.total}  {detail}"


def seconds_until_next_due() -> float | None:
    """Return how long until the earliest pending run is due (None when none is pending)."""
    first = demo_runs().filter(status=Status.PENDING).aggregate(at=Min("run_at"))["at"]
    return None if first is None else (first - timezone.now()).total_seconds()


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Format ``rows`` under ``header``: first column left-aligned, the others right."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return "  " + "  ".join(cells)

    return [line(header), "  " + "  ".join("-" * w for w in widths), *map(line, rows)]


def by_type_and_status() -> list[str]:
    """Return the table of runs by job type and status, with a total column and row."""
    cells: dict[str, Counter[str]] = defaultdict(Counter)
    for row in demo_runs().values("job_type", "status").annotate(n=Count("id")).order_by():
        cells[row["job_type"]][row["status"]] = row["n"]
    present = [s for s in STATUS_ORDER if any(c[s] for c in cells.values())]
    totals: Counter[str] = sum(cells.values(), Counter())
    rows = [
        [job_type, *(str(cells[job_type][s]) for s in present), str(cells[job_type].total())]
        for job_type in sorted(cells)
    ]
    rows.append(["all", *(str(totals[s]) for s in present), str(totals.total())])
    return table(["job type", *present, "total"], rows)


def attempts() -> tuple[int, int]:
    """Return (attempts made, retries among them) over the demo's runs."""
    stats = demo_runs().filter(attempts__gt=0).aggregate(attempts=Sum("attempts"), runs=Count("id"))
    made = stats["attempts"] or 0
    return made, made - stats["runs"]


def processing_seconds() -> float | None:
    """Return the seconds from the first claim to the last finish (database clock)."""
    span = demo_runs().aggregate(first=Min("started_at"), last=Max("finished_at"))
    if span["first"] is None or span["last"] is None:
        return None
    return float((span["last"] - span["first"]).total_seconds())


def queue_wait_ms() -> dict[str, float]:
    """Return the average enqueue-to-start time of first-attempt successes, by priority."""
    wait = ExpressionWrapper(F("started_at") - F("created_at"), output_field=DurationField())
    result = {}
    for label, priority in (("express", EXPRESS_PRIORITY), ("standard", 0)):
        avg = (
            demo_runs()
            .filter(priority=priority, status=Status.COMPLETED, attempts=1)
            .aggregate(wait=Avg(wait))["wait"]
        )
        if avg is not None:
            result[label] = avg.total_seconds() * 1000
    return result


def failures(limit: int = 8) -> list[str]:
    """Describe the runs that ended failed, one line each."""
    lines = []
    for run in demo_runs().filter(status=Status.FAILED).order_by("id")[:limit]:
        error = run.error or {}
        kind = str(error.get("type", "")).rsplit(".", 1)[-1]
        lines.append(
            f"  #{run.pk} {run.job_type} order={run.input.get('order_id')} "
            f"attempts={run.attempts}: {kind}: {error.get('message', '')}"
        )
    return lines
