"""django_jobs driver: one case in a fresh database, with bench/project as the Django project.

Cases: drain1 (bulk enqueue, drain by 1 worker, then idle latency), drain2 (2 workers),
steps (3-step runs, 1 worker), history (drain1 with completed runs of history in the
table), rss (worker RSS after warm-up and after --rss-runs runs), io (N runs of the
async handler ``bench.io``, each awaiting 0.1 s, by one worker), ratelimit (N runs of
the no-op ``bench.limited`` under ``rate_limit="R/s"``, by W workers), held (N no-op
runs drained by 1 worker beside a backlog of --held-runs runs no claim can take:
waiting for a concurrency key a running run holds, or due tomorrow; against the
same drain beside no backlog). Workers are
``manage.py runjobworker --pool default --concurrency C``, or without ``--concurrency``
when C is ``default``; io's is ``manage.py runjobworker --pool default
--async-concurrency C`` (its threads' --concurrency left at runjobworker's default:
the case has no sync runs); ratelimit's ``--concurrency 4 --burst``. On MariaDB:
drain1, drain2, steps, ratelimit and held (history and rss are written for
PostgreSQL; io counts the worker's sessions in pg_stat_activity).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any

import common

DB = "bench_run_djjobs"
PROJECT = os.path.join(common.BENCH_DIR, "project")
LAT_FILE = f"/tmp/{DB}_lat.txt"
TERMINAL = "('completed', 'failed', 'timed_out', 'canceled')"
# generate_series, VACUUM and CHECKPOINT (history); not yet measured elsewhere (rss);
# the connections counted in pg_stat_activity (io).
POSTGRESQL_ONLY = ("history", "rss", "io")
# The ratelimit case's threads per worker (as in tests/process/test_rate_limits_process.py).
RATELIMIT_THREADS = 4

os.environ["BENCH_DATABASE_URL"] = common.url(DB)
os.environ["BENCH_LAT_FILE"] = LAT_FILE
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
sys.path.insert(0, common.BENCH_DIR)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    if args.case in POSTGRESQL_ONLY and not common.servers.POSTGRESQL:
        raise RuntimeError(f"the {args.case} case runs on PostgreSQL only")
    if args.case == "io":
        # bench.io is registered only where this is set: here and in the worker, which
        # inherits it (see bench/project/benchapp/jobs.py).
        os.environ["BENCH_IO"] = "1"
    if args.case == "ratelimit":
        # bench.limited likewise: its limit is in force only in this case's processes.
        os.environ["BENCH_RATE_LIMIT"] = f"{args.ratelimit_rate}/s"
    common.recreate_db(DB)
    common.fresh_file(LAT_FILE)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    case = args.case
    if case == "held":
        return measure_held(args)
    if case == "events":
        return measure_events(args)
    record: dict[str, Any] = {"workers": 2 if case == "drain2" else 1}
    if case == "history":
        record.update(insert_history(args.history))
    if case == "rss":
        record.update(measure_rss(args))
        return record
    if case == "ratelimit":
        record.update(measure_ratelimit(args))
        return record
    job = {"steps": "bench.steps", "io": "bench.io"}.get(case, "bench.noop")
    io = case == "io"
    if io:
        record["config"] = f"--async-concurrency {args.io_concurrency}"
    base = last_id()
    record.update(enqueue(job, args.n))
    common.analyze(DB, "django_jobs_jobrun")
    done_sql = f"SELECT count(*) FROM django_jobs_jobrun WHERE id > {base} AND status IN {TERMINAL}"
    cmd = worker_cmd(args, ["--async-concurrency", str(args.io_concurrency)] if io else None)
    with common.Workers(f"django_jobs_{case}", [cmd] * record["workers"], PROJECT, {}) as workers:
        pgids = [p.pid for p in workers.procs]
        poll = common.IO_POLL if io else common.POLL
        sampler = common.ConnectionSampler(pgids, enabled=io)
        with common.LoadMonitor() as load, sampler:
            record.update(common.wait_drained(DB, done_sql, args.n, workers, poll=poll))
        record.update(load.result, **sampler.result)
        record.update(db_rate(base, args.n))
        if io:
            span = common.span_seconds(DB, "django_jobs_jobrun", f"id > {base}")
            record.update(common.io_figures(args.n, args.io_concurrency, span))
        if case == "drain1":
            from django_jobs import start

            def probe(tag: str) -> None:
                start("bench.latency", {"tag": tag})

            record["warmup_probe_s"] = common.wait_started(LAT_FILE, probe)
            record.update(common.measure_latency(probe, LAT_FILE, args.lat_samples))
    return record


def worker_cmd(args: argparse.Namespace, flags: list[str] | None = None) -> list[str]:
    """``manage.py runjobworker --pool default`` with ``flags``: by default
    ``--concurrency C`` (none when C is ``default``); the io case's
    ``--async-concurrency C``; the ratelimit case's ``--concurrency 4 --burst``."""
    if flags is None:
        flags = [] if args.concurrency == "default" else ["--concurrency", args.concurrency]
    cmd = [sys.executable, "manage.py", "runjobworker", "--pool", "default", *flags]
    if args.worker_verbosity is not None:
        cmd += ["-v", str(args.worker_verbosity)]
    return cmd


def enqueue(job: str, n: int) -> dict[str, Any]:
    from django_jobs import start_many

    t = time.perf_counter()
    start_many(job, [{}] * n)
    seconds = time.perf_counter() - t
    return {"enqueue_s": round(seconds, 3), "enqueue_per_s": round(n / seconds, 1)}


def last_id() -> int:
    return int(common.scalar(DB, "SELECT coalesce(max(id), 0) FROM django_jobs_jobrun"))


def db_rate(base: int, n: int) -> dict[str, Any]:
    """N / (last finish - first start), from the runs' own timestamps."""
    span = common.span_seconds(DB, "django_jobs_jobrun", f"id > {base}")
    completed = common.scalar(
        DB, f"SELECT count(*) FROM django_jobs_jobrun WHERE id > {base} AND status = 'completed'"
    )
    out: dict[str, Any] = {"drain_db_per_s": round(n / span, 1) if span else None}
    if completed != n:
        raise RuntimeError(f"{n - completed} of {n} runs did not complete")
    return out


def insert_history(rows: int) -> dict[str, Any]:
    """``rows`` completed runs in one INSERT ... SELECT generate_series, copied from a
    run start_many() wrote (so every column has a valid value whatever the schema)."""
    from django.db import connection

    from django_jobs import start_many

    template = start_many("bench.noop", [{}])[0].pk
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'django_jobs_jobrun' AND column_name <> 'id'"
            " ORDER BY ordinal_position"
        )
        columns = [name for (name,) in cursor.fetchall()]
        # Finished over the last ~14 hours, 50 ms apart, one attempt each.
        at = "now() - interval '14 hours' + g * interval '50 ms'"
        override = {
            "status": "'completed'",
            "attempts": "1",
            "created_at": at,
            "run_at": at,
            "started_at": f"{at} + interval '1 ms'",
            "finished_at": f"{at} + interval '3 ms'",
            "output": "'null'::jsonb",
        }
        select = ", ".join(override.get(c, f"t.{c}") for c in columns)
        t = time.perf_counter()
        cursor.execute(
            f"INSERT INTO django_jobs_jobrun ({', '.join(columns)}) SELECT {select}"
            " FROM django_jobs_jobrun t CROSS JOIN generate_series(1, %s) g WHERE t.id = %s",
            [rows, template],
        )
        cursor.execute("DELETE FROM django_jobs_jobrun WHERE id = %s", [template])
        inserted = time.perf_counter() - t
    common.scalar(DB, "VACUUM ANALYZE django_jobs_jobrun")
    common.scalar(DB, "CHECKPOINT")  # so no checkpoint of the insert lands in the drain
    return {
        "history_rows": rows,
        "history_insert_s": round(inserted, 1),
        "history_ready_s": round(time.perf_counter() - t, 1),
    }


def measure_rss(args: argparse.Namespace) -> dict[str, Any]:
    """RSS of one worker after a warm-up drain, then after ``--rss-runs`` more runs."""
    from django_jobs import start_many

    warmup = 2000
    batch = 10_000
    record: dict[str, Any] = {"rss_runs": args.rss_runs, "warmup_runs": warmup}
    with common.Workers("django_jobs_rss", [worker_cmd(args)], PROJECT, {}) as workers:
        pgid = workers.procs[0].pid
        start_many("bench.noop", [{}] * warmup)
        # As before every drain: fresh statistics (see bench/README.md, "Statistics").
        common.scalar(DB, "ANALYZE django_jobs_jobrun")
        wait_all(workers, warmup)
        time.sleep(1.0)
        before = common.rss_of_group(pgid)
        base = last_id()
        t = time.perf_counter()
        for offset in range(0, args.rss_runs, batch):
            start_many("bench.noop", [{}] * min(batch, args.rss_runs - offset))
        common.scalar(DB, "ANALYZE django_jobs_jobrun")
        with common.LoadMonitor() as load:
            wait_all(workers, warmup + args.rss_runs)
        record["rss_drain_per_s"] = round(args.rss_runs / (time.perf_counter() - t), 1)
        record.update(load.result)
        time.sleep(1.0)
        after = common.rss_of_group(pgid)
        db_rate(base, args.rss_runs)  # checks that every run completed
    record.update(
        worker_pid=after["pid"],
        rss_before_mb=round(before["rss_kb"] / 1024, 1),
        rss_after_mb=round(after["rss_kb"] / 1024, 1),
        hwm_after_mb=round(after["hwm_kb"] / 1024, 1),
        rss_growth_mb=round((after["rss_kb"] - before["rss_kb"]) / 1024, 1),
    )
    return record


def measure_ratelimit(args: argparse.Namespace) -> dict[str, Any]:
    """N runs of ``bench.limited`` (``rate_limit="R/s"``), enqueued at once, drained by
    W workers of RATELIMIT_THREADS threads with ``--burst``: how near the limit's pace
    they started (``started_at``), whether any second held more than R starts, and the
    time from starting the workers until the last one exited."""
    from django.db.models import Min

    from django_jobs.models import JobRun

    rate, workers_n = args.ratelimit_rate, args.ratelimit_workers
    flags = ["--concurrency", str(RATELIMIT_THREADS), "--burst"]
    record: dict[str, Any] = {
        "workers": workers_n,
        "config": f'rate_limit="{rate}/s"; {workers_n} workers, {" ".join(flags)}',
    }
    base = last_id()
    record.update(enqueue("bench.limited", args.n))
    common.analyze(DB, "django_jobs_jobrun")
    began, launched = time.monotonic(), time.time()
    cmds = [worker_cmd(args, flags)] * workers_n
    with common.Workers("django_jobs_ratelimit", cmds, PROJECT, {}) as workers:
        with common.LoadMonitor() as load:
            workers.wait(timeout=max(300.0, 3 * args.n / rate))
        record["wall_s"] = round(time.monotonic() - began, 3)
    record.update(load.result)
    record.update(db_rate(base, args.n))  # checks that every run completed
    starts = common.start_times(DB, "django_jobs_jobrun", f"id > {base}")
    record.update(common.ratelimit_figures(args.n, rate, starts))
    runs = JobRun.objects.filter(pk__gt=base)
    # From starting the workers to the first start (their start-up and first claim).
    first = runs.aggregate(first=Min("started_at"))["first"]
    record["first_start_s"] = round(first.timestamp() - launched, 3)
    # A claim gives every run it admits the same started_at.
    record["claims"] = runs.values("started_at").distinct().count()
    record["workers_started_runs"] = len(
        {ids[0] for ids in runs.values_list("worker_ids", flat=True) if ids}
    )
    return record


# The held case's backlogs: what each adds beside the drain (None: nothing, the
# reference; "stale": nothing, but the statistics taken while one run was pending;
# "one_tenant" and "tenants": nothing, the drained runs all of one tenant, or of
# 1,000 tenants, 20 each; "kind": async runs behind a full event loop). Then the
# fair turns (_fair).
HELD_BACKLOGS = (
    "none",
    "key",
    "rate",
    "kind",
    "tenant",
    "later",
    "paused",
    "stale",
    "one_tenant",
    "tenants",
    "tenants_unfair",
)
# The "rate" backlog's limit: one start a minute, full once the first run started.
HELD_RATE = "1/m"
FAIR_LATE = 20  # runs of other tenants started while one tenant's backlog drains


def measure_held(args: argparse.Namespace) -> dict[str, Any]:
    """N no-op runs drained by one worker beside each backlog of ``--held-runs`` runs
    the claim cannot take, each in a fresh database: runs waiting for a concurrency
    key that a running ``bench.hold`` run holds (started while it does), runs due
    tomorrow, runs of a paused pool the worker also serves, runs of a tenant
    at its cap (``TENANT_CONCURRENCY`` 1, which a running ``bench.hold`` run of
    the tenant fills: the worker claims under caps), or async runs while the
    worker's one async slot (``--async-concurrency 1``) is taken by a running
    ``bench.ahold``; and beside no backlog, the reference. The ``bench.hold`` run takes one of the worker's threads in every
    backlog alike. Statistics are fresh (ANALYZE after the enqueue), as in drain1,
    but for "stale": no backlog, and the statistics taken while one run was
    pending, automatic ones turned off (a burst after an idle spell)."""
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.test import override_settings

    from django_jobs import cancel, start, start_many
    from django_jobs.models import JobRun
    from django_jobs.pools import pause_pool

    backlog = args.held_runs
    record: dict[str, Any] = {
        "workers": 1,
        "config": f"--concurrency {args.concurrency}; backlog {backlog:,} runs",
    }
    # BENCH_HELD_BACKLOGS: some of them only ("none" always), to look at one closely.
    only = os.environ.get("BENCH_HELD_BACKLOGS")
    backlogs = [
        name for name in HELD_BACKLOGS if only is None or name == "none" or name in only.split(",")
    ]
    for name in backlogs:
        connections.close_all()  # recreating the database ends this process's sessions
        common.recreate_db(DB)
        call_command("migrate", verbosity=0)
        capped = name == "tenant"
        holder = start("bench.hold", {}, concurrency_key="busy", tenant_id="big")
        if name == "stale":
            _stale_statistics()
        # Every worker serves the paused pool too: one that does not never reads it.
        cmd = worker_cmd(args) + ["--pool", "parked"]
        env = {"BENCH_TENANT_CONCURRENCY": "1"} if capped else {}
        caps = override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "TENANT_CONCURRENCY": 1})
        if name == "rate":
            env = {"BENCH_RATE_LIMIT": HELD_RATE}
        if name == "kind":
            env = {"BENCH_ASYNC_HOLD": "1"}
            cmd += ["--async-concurrency", "1"]
        unfair = name == "tenants_unfair"
        if unfair:
            env = {"BENCH_FAIR_TURNS": "0"}
            caps = override_settings(DJANGO_JOBS={**settings.DJANGO_JOBS, "FAIR_TURNS": False})
        with common.Workers(f"django_jobs_held_{name}", [cmd], PROJECT, env) as workers, (
            caps if capped or unfair else contextlib.nullcontext()
        ):
            _wait_for(holder.pk, "running", workers, "bench.hold to start")
            t = time.perf_counter()
            if name == "key":
                start_many("bench.noop", [{}] * backlog, concurrency_key="busy")
            elif name == "rate":
                _limited_backlog(backlog, workers)
            elif name == "kind":
                async_holder = _async_backlog(backlog, workers)
            elif name == "later":
                start_many("bench.noop", [{}] * backlog, delay=86400)
            elif name == "paused":
                pause_pool("parked")
                start_many("bench.noop", [{}] * backlog, pool="parked")
            elif name == "tenant":
                start_many("bench.noop", [{}] * backlog, tenant_id="big")
            record[f"{name}_enqueue_s"] = round(time.perf_counter() - t, 3)
            base = last_id()
            if name == "one_tenant":
                start_many("bench.noop", [{}] * args.n, tenant_id="one")
            elif name in ("tenants", "tenants_unfair"):
                # In one transaction: the worker sees them all at once, as it sees
                # the others' one statement (the drain is timed, not the starts).
                with transaction.atomic():
                    for tenant in range(1000):
                        start_many("bench.noop", [{}] * (args.n // 1000), tenant_id=f"t{tenant}")
            else:
                enqueue("bench.noop", args.n)
            if name != "stale":
                common.analyze(DB, "django_jobs_jobrun")
            done_sql = f"SELECT count(*) FROM django_jobs_jobrun WHERE id > {base} AND status = 'completed'"
            common.wait_drained(DB, done_sql, args.n, workers)
            rate = db_rate(base, args.n)["drain_db_per_s"]
            record[f"{name}_per_s"] = rate
            if name in ("key", "tenant", "rate"):
                held = JobRun.objects.filter(hold=name).count()
                record[f"{name}_held_at_end"] = held
            if name == "kind":
                record["kind_left_at_end"] = JobRun.objects.filter(
                    job_type="bench.anoop", status="pending"
                ).count()
            # The backlog goes first, so that the holder's end releases nothing.
            JobRun.objects.filter(pk__gt=holder.pk, pk__lte=base, status="pending").delete()
            cancel(holder.pk)
            if name == "kind":
                cancel(async_holder)
    for name in backlogs[1:]:
        ratio = record[f"{name}_per_s"] / record["none_per_s"]
        record[f"{name}_x"] = round(ratio, 3)
    if only is None or "fair" in only.split(","):
        record.update(_fair(args, worker_cmd(args)))
    return record


def _limited_backlog(backlog: int, workers: Any) -> None:
    """``bench.limited`` under HELD_RATE (registered here as the worker registers it):
    one run started, its window full for a minute, then the backlog."""
    from django_jobs import job, start, start_many
    from django_jobs.registry import get_handler
    from django_jobs.exceptions import UnknownJobType

    try:
        get_handler("bench.limited")
    except UnknownJobType:
        job("bench.limited", rate_limit=HELD_RATE)(lambda ctx: None)
    first = start("bench.limited", {})
    _wait_for(first.pk, "completed", workers, "the first bench.limited run to complete")
    start_many("bench.limited", [{}] * backlog)


def _wait_for(run_id: int, status: str, workers: Any, what: str, timeout: float = 60) -> None:
    """Wait until the run ``run_id`` has ``status``; raise when a worker dies or after
    ``timeout`` seconds (``what`` says what was waited for)."""
    from django_jobs.models import JobRun

    deadline = time.monotonic() + timeout
    while JobRun.objects.get(pk=run_id).status != status:
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}")
        workers.check_alive(f"waiting for {what}")
        time.sleep(0.05)


def _async_backlog(backlog: int, workers: Any) -> int:
    """A running ``bench.ahold`` (the worker's one async slot taken), then ``backlog``
    async no-ops behind it; the holder's id. Registered here as the worker
    registers them (BENCH_ASYNC_HOLD)."""
    from django_jobs import job, start, start_many
    from django_jobs.exceptions import UnknownJobType
    from django_jobs.registry import get_handler

    async def nothing(ctx: Any) -> None:
        return None

    for job_type in ("bench.ahold", "bench.anoop"):
        try:
            get_handler(job_type)
        except UnknownJobType:
            job(job_type)(nothing)
    holder = start("bench.ahold", {})
    _wait_for(holder.pk, "running", workers, "bench.ahold to start")
    start_many("bench.anoop", [{}] * backlog)
    return holder.pk


def _fair(args: argparse.Namespace, cmd: list[str]) -> dict[str, Any]:
    """Tenant ``a`` starts ``--held-runs`` runs; once their drain is under way, other
    tenants start FAIR_LATE runs, 0.1 s apart: how long each waited from its start
    (created_at) to its claim (started_at), on the database's clock, and how many
    of a's runs were claimed after the last of them."""
    from django.core.management import call_command
    from django.db import connections

    from django_jobs import start, start_many
    from django_jobs.models import JobRun

    connections.close_all()
    common.recreate_db(DB)
    call_command("migrate", verbosity=0)
    start_many("bench.noop", [{}] * args.held_runs, tenant_id="a")
    common.analyze(DB, "django_jobs_jobrun")
    with common.Workers("django_jobs_held_fair", [cmd], PROJECT, {}) as workers:
        deadline = time.monotonic() + 60
        while not JobRun.objects.filter(status="completed").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the fair backlog did not start draining")
            workers.check_alive("waiting for the fair backlog to drain")
            time.sleep(0.05)
        time.sleep(1.0)
        late = []
        for n in range(FAIR_LATE):
            late.append(start("bench.noop", {}, tenant_id=f"b{n}").pk)
            time.sleep(0.1)
        wait_all(workers, args.held_runs + FAIR_LATE)
    rows = JobRun.objects.filter(pk__in=late).values_list("created_at", "started_at")
    waits = sorted((started - created).total_seconds() for created, started in rows)
    last = max(started for _, started in rows)
    return {
        "fair_wait_p50_s": round(statistics.median(waits), 4),
        "fair_wait_max_s": round(waits[-1], 4),
        "fair_backlog_left": JobRun.objects.filter(tenant_id="a", started_at__gt=last).count(),
    }


# The events case: samples of each latency, and the runs that wait for one event each.
EVENT_SAMPLES = 200


def measure_events(args: argparse.Namespace) -> dict[str, Any]:
    """With one idle worker: the time from ``send_event()``'s commit to the handler's
    next line, and from a run's ``finished_at`` to ``run.wait()`` returning, over
    EVENT_SAMPLES each; then ``--n`` runs (10,000) each waiting for one event, the
    events sent in one transaction, drained, with the worker's thread count."""
    import random

    from django.db import transaction

    from django_jobs import send_event, start, start_many
    from django_jobs.models import JobRun

    samples = min(EVENT_SAMPLES, args.n)
    record: dict[str, Any] = {"workers": 1}
    with common.Workers("django_jobs_events", [worker_cmd(args)], PROJECT, {}) as workers:
        common.wait_started(LAT_FILE, lambda tag: start("bench.latency", {"tag": tag}))
        sent: list[float] = []
        for n in range(samples):
            tag = f"e{n}-{random.randrange(1 << 30)}"
            run = start("bench.await_event", {})
            _wait_status(run.pk, "waiting")
            time.sleep(random.uniform(0.05, 0.2))  # idle, as a webhook finds it
            send_event(run, "go", {"tag": tag})  # autocommit: committed on return
            at = time.time()
            while (mark := common._read_marks(LAT_FILE).get(tag)) is None:
                if time.time() - at > 15:
                    raise TimeoutError(f"event {tag} not taken after 15 s")
                time.sleep(0.001)
            sent.append((mark - at) * 1000)
        waited: list[float] = []
        for _ in range(samples):
            run = start("bench.noop", {})
            run.wait(timeout=30)
            returned = time.time()
            finished = JobRun.objects.values_list("finished_at", flat=True).get(pk=run.pk)
            waited.append((returned - finished.timestamp()) * 1000)
        record.update(_event_figures("event", sent), **_event_figures("wait", waited))
        base = last_id()
        t = time.perf_counter()
        start_many("bench.await_event", [{}] * args.n)
        waiting_sql = (
            f"SELECT count(*) FROM django_jobs_jobrun WHERE id > {base} AND status = 'waiting'"
        )
        common.wait_drained(DB, waiting_sql, args.n, workers)
        record["events_waiting_s"] = round(time.perf_counter() - t, 2)
        record["events_worker_threads"] = _threads(workers.procs[0].pid)
        ids = list(JobRun.objects.filter(pk__gt=base).values_list("pk", flat=True))
        t = time.perf_counter()
        with transaction.atomic():
            for run_id in ids:
                send_event(run_id, "go", None)
        record["events_send_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        done_sql = f"SELECT count(*) FROM django_jobs_jobrun WHERE id > {base} AND status IN {TERMINAL}"
        common.wait_drained(DB, done_sql, args.n, workers)
        record["events_drain_s"] = round(time.perf_counter() - t, 2)
        record["events_drain_per_s"] = round(args.n / record["events_drain_s"], 1)
    return record


def _event_figures(name: str, values: list[float]) -> dict[str, Any]:
    return {
        f"{name}_p50_ms": round(statistics.median(values), 2),
        f"{name}_p90_ms": round(common.percentile(values, 90), 2),
    }


def _wait_status(run_id: int, status: str, timeout: float = 15) -> None:
    from django_jobs.models import JobRun

    deadline = time.monotonic() + timeout
    while not JobRun.objects.filter(pk=run_id, status=status).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} not {status} after {timeout} s")
        time.sleep(0.002)


def _threads(pid: int) -> int | None:
    """The threads of process ``pid`` (Linux), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _stale_statistics() -> None:
    """Statistics of the runs table taken while one run is pending (the bench.hold run
    runs, one bench.noop waits), and no automatic ones until the database is dropped."""
    from django_jobs import start

    extra = start("bench.noop", {}, pool="nobody")
    common.analyze(DB, "django_jobs_jobrun")
    if common.servers.POSTGRESQL:
        common.scalar(DB, "ALTER TABLE django_jobs_jobrun SET (autovacuum_enabled = false)")
    else:
        common.scalar(DB, "ALTER TABLE django_jobs_jobrun STATS_AUTO_RECALC = 0")
    extra.delete()


def wait_all(workers: common.Workers, total: int) -> None:
    """Wait until all ``total`` runs in the table are finished (counting the unfinished
    ones goes through the partial indexes, not over every finished run)."""
    done_sql = (
        f"SELECT {total} - count(*) FROM django_jobs_jobrun WHERE status IN ('pending', 'running')"
    )
    common.wait_drained(DB, done_sql, total, workers)


if __name__ == "__main__":
    common.driver_main(measure)
