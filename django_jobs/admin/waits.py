"""What keeps a pending run from running, said on its page (**waits for**): the runs
that hold its concurrency key's slots, or its tenant's under the pool's cap, or a
full window of its rate limit (and when it opens)."""

from __future__ import annotations

from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from .. import conf, ratelimits
from ..models import Hold, JobRun, RateLimitScope, Status
from ..registry import all_handlers
from ..storage import ratelimits as limited
from ..storage.reading import LATEST
from . import display

# The runs named as holding a group's slots, of the first by id.
HOLDERS_SHOWN = 5


def waits_for(run: JobRun) -> SafeString | str | None:
    """What the pending ``run`` waits for, or None when nothing holds it back."""
    if run.status != Status.PENDING:
        return None
    return _key(run) or _tenant(run) or _rate(run)


def _key(run: JobRun) -> SafeString | str | None:
    if run.concurrency_key is None:
        return None
    limit = max(1, run.concurrency_limit)
    running = _runs().filter(concurrency_key=run.concurrency_key, status=Status.RUNNING)
    if limit == 1:
        holder = running.only("id", "job_type", "status").order_by("id").first()
        if holder is not None:
            return format_html(
                gettext("its concurrency key, which {run} holds"), run=display.run_label(holder)
            )
    elif _full(running, limit):
        return format_html(
            gettext("its concurrency key, whose {limit} slots {runs} hold"),
            limit=limit,
            runs=_holders(running, limit),
        )
    if run.hold == Hold.KEY:
        return gettext("its concurrency key, free now: it is released next")
    return None


def _tenant(run: JobRun) -> SafeString | str | None:
    cap = conf.tenant_cap(run.pool) if run.tenant_id is not None else None
    if cap is not None:
        running = _runs().filter(tenant_id=run.tenant_id, pool=run.pool, status=Status.RUNNING)
        if _full(running, cap):
            return format_html(
                gettext("its tenant's cap of {cap} runs in this pool, which {runs} hold"),
                cap=cap,
                runs=_holders(running, cap),
            )
    if run.hold == Hold.TENANT:
        return gettext("its tenant's cap, with room now: it is released next")
    return None


def _rate(run: JobRun) -> SafeString | str | None:
    """The first limit of the run (its job's, its key's, its pool's, as this code base
    and its settings declare them) whose window is full under its rate, and when it
    opens."""
    limits = ratelimits.in_force(all_handlers(tasks=True), [run.pool])
    row = {"pool": run.pool, "job_type": run.job_type, "rate_key": run.rate_key}
    for scope, name, rate in limited.limits_of(row, limits):
        opens = (
            limited.limit_rows()
            .filter(scope=scope, name=name, limit=rate.count, period=rate.seconds)
            # A date Python cannot hold (written by hand) is not read.
            .filter(open_at__gt=Now(), open_at__lte=LATEST)
            .values_list("open_at", flat=True)
            .first()
        )
        if opens is not None:
            return format_html(
                gettext("its rate limit {rate} ({scope} {name}), whose window opens at {when}"),
                rate=str(rate),
                scope=RateLimitScope(scope).label,
                name=name,
                when=display.timestamp(opens),
            )
    if run.hold == Hold.RATE:
        return gettext("its rate limit's window, open now: it is released next")
    return None


def _runs() -> QuerySet[JobRun]:
    return JobRun.objects.using(conf.get().DATABASE)


def _full(running: QuerySet[JobRun], limit: int) -> bool:
    return running.order_by()[:limit].count() >= limit


def _holders(running: QuerySet[JobRun], limit: int) -> SafeString:
    holders = running.only("id", "job_type", "status").order_by("id")[:HOLDERS_SHOWN]
    shown = format_html_join(", ", "{}", ((display.run_label(h),) for h in holders))
    return shown if limit <= HOLDERS_SHOWN else format_html("{}, …", shown)
