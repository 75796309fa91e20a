"""The table of a benchmark run: bench/run.py's summary of its raw records.

    python3 bench/run.py --summarize bench/results/<UTC time>.jsonl

Median (min-max) over rounds; ratios are taken within each round, then their median.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")
LABELS = {
    "django_jobs": "django_jobs",
    "pgqueuer": "PgQueuer",
    "procrastinate": "Procrastinate",
    "django_tasks_db": "django-tasks-db",
}
TIMES, DASH = "\N{MULTIPLICATION SIGN}", "\N{EN DASH}"


def write_summary(records: list[dict[str, Any]], raw_path: str, quick: bool) -> str:
    meta = next((r for r in records if r.get("system") == "meta"), {})
    if "mariadb" in meta:
        text = summarize_mariadb(records, os.path.relpath(raw_path, REPO))
        name = "summary-mariadb.md"
    else:
        text = summarize(records, os.path.relpath(raw_path, REPO))
        name = "summary.md"
    if quick or "-quick" in raw_path:
        name = name.replace(".md", "-quick.md")
    with open(os.path.join(RESULTS, name), "w") as f:
        f.write(text)
    return text


class Records:
    """The measurements of one raw file, looked up by system, case and key."""

    def __init__(self, records: list[dict[str, Any]]):
        self.meta = next((r for r in records if r.get("system") == "meta"), {})
        self.runs = [r for r in records if r.get("system") != "meta"]
        self.ok = [r for r in self.runs if "error" not in r]

    def values(self, system: str, case: str, key: str) -> list[float]:
        return list(self.by_round(system, case, key).values())

    def by_round(self, system: str, case: str, key: str) -> dict[int, float]:
        return {
            r["round"]: r[key]
            for r in self.ok
            if r["system"] == system and r["case"] == case and r.get(key) is not None
        }

    def ratio(self, a: tuple[str, str, str], b: tuple[str, str, str]) -> list[float]:
        """a / b round by round, where both were measured."""
        return list(self.ratio_by_round(a, b).values())

    def ratio_by_round(self, a: tuple[str, str, str], b: tuple[str, str, str]) -> dict[int, float]:
        num, den = self.by_round(*a), self.by_round(*b)
        return {k: num[k] / den[k] for k in sorted(num) if den.get(k)}

    def pooled(self, system: str, pct: float) -> float | None:
        """A latency percentile over every sample of every round."""
        samples = [x for r in self.ok if r["system"] == system for x in r.get("lat_ms", [])]
        return percentile(samples, pct) if samples else None


def summarize(records: list[dict[str, Any]], raw_name: str) -> str:
    rec = Records(records)
    meta, runs, ok = rec.meta, rec.runs, rec.ok
    values, ratio, pooled = rec.values, rec.ratio, rec.pooled

    dj = "django_jobs"
    drain1 = ratio((dj, "drain1", "drain_per_s"), ("pgqueuer", "drain1", "drain_per_s"))
    drain2 = ratio((dj, "drain2", "drain_per_s"), ("pgqueuer", "drain2", "drain_per_s"))
    enqueue = ratio((dj, "drain1", "enqueue_per_s"), ("pgqueuer", "drain1", "enqueue_per_s"))
    history = ratio((dj, "history", "drain_per_s"), (dj, "drain1", "drain_per_s"))
    p50, p90 = pooled(dj, 50), pooled(dj, 90)
    steps = values(dj, "steps", "drain_per_s")
    rss = values(dj, "rss", "rss_growth_mb")

    def med(vals: list[float]) -> float | None:
        return statistics.median(vals) if vals else None

    def check(value: float | None, ok_if: bool) -> str:
        return "n/a" if value is None else ("yes" if ok_if else "**no**")

    r1, r2 = med(drain1), med(drain2)
    targets = [
        (
            "drain, 1 process (runs/s)",
            mmm(values(dj, "drain1", "drain_per_s")),
            mmm(values("pgqueuer", "drain1", "drain_per_s")),
            mmm(drain1, ".2f", TIMES),
            f"≥ 1.5{TIMES} PgQueuer (floor 1.0{TIMES})",
            drain_verdict(r1),
        ),
        (
            "drain, 2 processes (runs/s)",
            mmm(values(dj, "drain2", "drain_per_s")),
            mmm(values("pgqueuer", "drain2", "drain_per_s")),
            mmm(drain2, ".2f", TIMES),
            f"≥ 1.5{TIMES} PgQueuer (floor 1.0{TIMES})",
            drain_verdict(r2),
        ),
        (
            "bulk enqueue, 20k (runs/s)"
            if meta.get("options", {}).get("n") == 20000
            else "bulk enqueue (runs/s)",
            mmm(values(dj, "drain1", "enqueue_per_s")),
            mmm(values("pgqueuer", "drain1", "enqueue_per_s")),
            mmm(enqueue, ".2f", TIMES),
            f"≥ 1.0{TIMES} PgQueuer",
            check(med(enqueue), (med(enqueue) or 0) >= 1.0),
        ),
        (
            "idle latency p50 (ms, pooled)",
            fmt(p50, ".1f"),
            fmt(pooled("pgqueuer", 50), ".1f"),
            "",
            "≤ 5 ms",
            check(p50, (p50 or 0) <= 5),
        ),
        (
            "idle latency p90 (ms, pooled)",
            fmt(p90, ".1f"),
            fmt(pooled("pgqueuer", 90), ".1f"),
            "",
            "≤ 10 ms",
            check(p90, (p90 or 0) <= 10),
        ),
        (
            "3-step run, 1 process (runs/s)",
            mmm(steps),
            "",
            "",
            "≥ 1,000 runs/s",
            check(med(steps), (med(steps) or 0) >= 1000),
        ),
        (
            f"drain with {meta.get('options', {}).get('history', 0):,} runs of history / empty",
            mmm(history, ".2f", TIMES),
            "",
            "",
            "≥ 0.9",
            check(med(history), (med(history) or 0) >= 0.9),
        ),
        (
            f"worker RSS growth over {meta.get('options', {}).get('rss_runs', 0):,} runs (MB)",
            mmm(rss, ".1f"),
            "",
            "",
            "< 20 MB",
            check(med(rss), (med(rss) or 0) < 20),
        ),
    ]
    lines = [
        "# Benchmark: django_jobs beside its peers",
        "",
        *machine_lines(meta, raw_name),
        "",
        f"Median (min{DASH}max) over rounds; ratios are taken within each round, then their"
        " median. Latency percentiles pool every sample of every round.",
        "",
        "| metric | django_jobs | PgQueuer | django_jobs / PgQueuer | target | met |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in targets),
        "",
        *io_section(rec),
        *ratelimit_section(rec),
        *held_section(rec),
        *events_section(rec),
        *every_system(rec),
    ]
    lines += [
        "",
        "django_jobs, more: "
        f"drain with history {mmm(values(dj, 'history', 'drain_per_s'))} runs/s; "
        f"3-step runs by DB timestamps {mmm(values(dj, 'steps', 'drain_db_per_s'))} runs/s; "
        f"history insert {mmm(values(dj, 'history', 'history_insert_s'), '.1f')} s; "
        f"worker RSS after warm-up {mmm(values(dj, 'rss', 'rss_before_mb'), '.1f')} MB, "
        f"after {mmm(values(dj, 'rss', 'rss_after_mb'), '.1f')} MB "
        f"(peak {mmm(values(dj, 'rss', 'hwm_after_mb'), '.1f')} MB).",
    ]
    lines += per_round(ok)
    lines += error_lines(runs)
    return "\n".join(lines) + "\n"


# The io case's targets (the issue): django_jobs' DB span at most IO_IDEAL_TARGET times
# the ideal, at most PgQueuer's, and its worker holding at most IO_CONNECTIONS_TARGET
# connections (at --io-concurrency 500).
IO_IDEAL_TARGET = 1.5
IO_CONNECTIONS_TARGET = 10
IO_SYSTEMS = ("django_jobs", "pgqueuer", "procrastinate")


def io_section(rec: Records) -> list[str]:
    """The io case: the systems side by side, the targets, and round by round."""
    if not any(r["case"] == "io" for r in rec.ok):
        return []
    values, by_round = rec.values, rec.by_round
    dj, pgq = "django_jobs", "pgqueuer"
    io = [r for r in rec.ok if r["case"] == "io"]
    n = sorted({r["n"] for r in io})
    conc = sorted({r["io_concurrency"] for r in io if r.get("io_concurrency")})
    ideal = sorted({r["ideal_s"] for r in io if r.get("ideal_s")})
    lines = [
        f"## I/O-bound (io): {' / '.join(f'{x:,}' for x in n)} runs of `asyncio.sleep(0.1)`,"
        f" one worker process, {' / '.join(map(str, conc))} at once",
        "",
        "DB span: first start to last finish, from each system's own tables; ideal:"
        f" ceil(N / C) {TIMES} 0.1 s; drain wall: the poller's, from the first finished"
        " run seen to the last (every 50 ms); connections: the most PostgreSQL sessions"
        " of the worker process seen in pg_stat_activity, sampled every 50 ms during the"
        " drain.",
        "",
        "| system (config) | DB span s | ideal s | span / ideal | drain wall s"
        " | max connections | bulk enqueue s | foreign load, cores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system in IO_SYSTEMS:
        if not values(system, "io", "n"):
            continue
        configs = sorted({r["config"] for r in io if r["system"] == system and "config" in r})
        label = LABELS[system] + (f" ({'; '.join(configs)})" if configs else "")
        lines.append(
            f"| {label} | {mmm(values(system, 'io', 'span_s'), '.2f')}"
            f" | {mmm(values(system, 'io', 'ideal_s'), '.1f')}"
            f" | {mmm(values(system, 'io', 'span_over_ideal'), '.2f', TIMES)}"
            f" | {mmm(values(system, 'io', 'drain_s'), '.2f')}"
            f" | {mmm(values(system, 'io', 'max_connections'), 'g')}"
            f" | {mmm(values(system, 'io', 'enqueue_s'), '.2f')}"
            f" | {mmm(values(system, 'io', 'foreign_cores'), '.2f')} |"
        )
    over_ideal = values(dj, "io", "span_over_ideal")
    vs_pgq = rec.ratio((dj, "io", "span_s"), (pgq, "io", "span_s"))
    conns = values(dj, "io", "max_connections")
    med = {
        k: statistics.median(v) if v else None
        for k, v in {"ideal": over_ideal, "pgq": vs_pgq, "conns": conns}.items()
    }

    def met(value: float | None, ok: bool) -> str:
        return "n/a" if value is None else ("yes" if ok else "**no**")

    at = f" at C = {' / '.join(map(str, conc))}" if conc else ""
    lines += [
        "",
        "| target (django_jobs) | figure | met |",
        "|---|---|---|",
        f"| DB span ≤ {IO_IDEAL_TARGET}{TIMES} the ideal"
        f" ({' / '.join(f'{x:.1f}' for x in ideal)} s){at}"
        f" | {mmm(over_ideal, '.2f', TIMES)}"
        f" | {met(med['ideal'], (med['ideal'] or 0) <= IO_IDEAL_TARGET)} |",
        f"| at least as fast as PgQueuer: DB span, django_jobs / PgQueuer ≤ 1.0{TIMES}"
        f" | {mmm(vs_pgq, '.2f', TIMES)} | {met(med['pgq'], (med['pgq'] or 0) <= 1.0)} |",
        f"| worker's connections ≤ {IO_CONNECTIONS_TARGET}{at} (max in pg_stat_activity)"
        f" | {mmm(conns, 'g')}"
        f" | {met(med['conns'], max(conns or [0]) <= IO_CONNECTIONS_TARGET)} |",
        "",
        "Round by round (DB span s, span / ideal; max connections):",
        "",
        "| round | django_jobs | PgQueuer | Procrastinate | django_jobs / PgQueuer |",
        "|---|---|---|---|---|",
    ]
    spans = {s: by_round(s, "io", "span_s") for s in IO_SYSTEMS}
    ratios = {s: by_round(s, "io", "span_over_ideal") for s in IO_SYSTEMS}
    peaks = {s: by_round(s, "io", "max_connections") for s in IO_SYSTEMS}
    pair = rec.ratio_by_round((dj, "io", "span_s"), (pgq, "io", "span_s"))
    for rnd in sorted({r["round"] for r in io}):
        cells = [
            f"{fmt(spans[s].get(rnd), '.2f')} ({fmt(ratios[s].get(rnd), '.2f', TIMES)};"
            f" {fmt(peaks[s].get(rnd), 'g')})"
            if rnd in spans[s]
            else "n/a"
            for s in IO_SYSTEMS
        ]
        lines.append(f"| {rnd} | {' | '.join(cells)} | {fmt(pair.get(rnd), '.2f', TIMES)} |")
    return [*lines, ""]


# The ratelimit case's columns: (key, format, unit), then whether the limit held.
RATELIMIT_COLUMNS = [
    ("span_s", ".2f", ""),
    ("ideal_s", ".1f", ""),
    ("span_over_ideal", ".2f", TIMES),
    ("most_in_a_second", "g", ""),
    ("first_start_s", ".1f", ""),
    ("wall_s", ".1f", ""),
    ("claims", ",.0f", ""),
    ("foreign_cores", ".2f", ""),
]


def ratelimit_section(rec: Records) -> list[str]:
    """The ratelimit case (django_jobs): round by round, whether the limit held, medians."""
    runs = sorted((r for r in rec.ok if r["case"] == "ratelimit"), key=lambda r: r["round"])
    if not runs:
        return []

    def each(key: str) -> str:
        return " / ".join(f"{x:,}" for x in sorted({r[key] for r in runs if key in r}))

    lines = [
        f"## Rate limit (ratelimit): {each('n')} runs of a no-op under"
        f' `rate_limit="{each("rate")}/s"`, {each("workers")} worker processes of 4 threads'
        " (`--burst`)",
        "",
        "Span: first start to last start (`started_at`); ideal: (N \N{MINUS SIGN} R) / R,"
        " the first R at once, then R a second; most in a second: the most starts in any"
        " half-open second [t, t + 1), which the limit must hold to R; first start and wall:"
        " from starting the workers until the first start, and until the last worker"
        " exited; claims: the claims that started runs (one"
        " `started_at` each).",
        "",
        "| round | span s | ideal s | span / ideal | most in a second | first start s | wall s"
        " | claims | foreign load, cores | limit held |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        held = f"**NO: {r['limit_violation']}**" if "limit_violation" in r else "yes"
        cells = [fmt(r.get(key), spec, unit) for key, spec, unit in RATELIMIT_COLUMNS]
        lines.append(f"| {r['round']} | {' | '.join(cells)} | {held} |")
    broken = [str(r["round"]) for r in runs if "limit_violation" in r]
    cells = [
        mmm(rec.values("django_jobs", "ratelimit", key), spec, unit)
        for key, spec, unit in RATELIMIT_COLUMNS
    ]
    held = f"**NO, round {', '.join(broken)}**" if broken else "yes"
    return [*lines, f"| median (min{DASH}max) | {' | '.join(cells)} | {held} |", ""]


# The held case's target (issue 29): a drain beside each backlog at least this
# fraction of the drain beside none, in the same round.
HELD_TARGET = 0.8
HELD_BACKLOGS = {
    "key": "waiting for a taken concurrency key",
    "rate": "waiting for a full rate-limit window (1/m)",
    "kind": "async, behind a full event loop (--async-concurrency 1)",
    "tenant": "of a tenant at its cap (TENANT_CONCURRENCY 1; claims under caps)",
    "later": "due tomorrow",
    "paused": "in a paused pool the worker serves",
    "stale": "none, statistics taken with one pending run",
    "one_tenant": "none, the drained runs all of one tenant",
    "tenants": "none, the drained runs of 1,000 tenants",
    "tenants_unfair": "none, the drained runs of 1,000 tenants, FAIR_TURNS off",
}
# The fair turns' target: another tenant's run claimed within a second of its start.
FAIR_TARGET_S = 1.0


def held_section(rec: Records) -> list[str]:
    """The held case (django_jobs): drains beside backlogs no claim can take."""
    runs = sorted((r for r in rec.ok if r["case"] == "held"), key=lambda r: r["round"])
    if not runs:
        return []
    sizes = " / ".join(f"{r['n']:,} runs beside {r['config']}" for r in runs[:1])
    lines = [
        f"## Held backlogs (held): {sizes}",
        "",
        "Runs/s by the runs' own timestamps, each drain in a fresh database with fresh"
        " statistics; the ratio is against the drain beside no backlog in the same round"
        f" (target {TIMES}{HELD_TARGET} or more).",
        "",
        "| backlog | runs/s | ratio | met |",
        "|---|---|---|---|",
        f"| none (reference) | {mmm(rec.values('django_jobs', 'held', 'none_per_s'))} | | |",
    ]
    for name, label in HELD_BACKLOGS.items():
        ratios = rec.values("django_jobs", "held", f"{name}_x")
        ratio = statistics.median(ratios) if ratios else None
        met = "" if ratio is None else ("yes" if ratio >= HELD_TARGET else "**no**")
        lines.append(
            f"| {label} | {mmm(rec.values('django_jobs', 'held', f'{name}_per_s'))}"
            f" | {mmm(ratios, '.2f', TIMES)} | {met} |"
        )
    waits = rec.values("django_jobs", "held", "fair_wait_max_s")
    if waits:
        met = "yes" if max(waits) <= FAIR_TARGET_S else "**no**"
        p50 = mmm(rec.values("django_jobs", "held", "fair_wait_p50_s"), ".3f")
        lines += [
            "",
            "Runs of other tenants started while one tenant's backlog drains, from start"
            f" to claim (target {FAIR_TARGET_S:g} s at most): p50 {p50} s,"
            f" max {mmm(waits, '.3f')} s; met: {met}.",
        ]
    return [*lines, ""]


# The events case's targets (issue 30): p50s on PostgreSQL.
EVENT_TARGET_MS = 10.0


def events_section(rec: Records, *, polled: bool = False) -> list[str]:
    """The events case (django_jobs): an event's way into a waiting run, a caller's
    wait for a run's end, and many runs waiting for one event each. ``polled``: a
    database without LISTEN (MariaDB), where the target does not apply."""
    runs = [r for r in rec.ok if r["case"] == "events"]
    if not runs:
        return []
    value = functools.partial(rec.values, "django_jobs", "events")
    event_p50, wait_p50 = value("event_p50_ms"), value("wait_p50_ms")
    met = (
        "yes"
        if max(event_p50) <= EVENT_TARGET_MS and max(wait_p50) <= EVENT_TARGET_MS
        else "**no**"
    )
    target = (
        "the worker and the caller poll: no target"
        if polled
        else f"target p50 {EVENT_TARGET_MS:g} ms or less: {met}"
    )
    return [
        "## Events and results (events)",
        "",
        "With one idle worker: from `send_event()`'s commit to the waiting handler's next"
        f" line, and from a run's `finished_at` to `run.wait()` returning ({target}).",
        "",
        "| measure | p50 ms | p90 ms |",
        "|---|---|---|",
        f"| event sent to handler | {mmm(event_p50, '.2f')} | {mmm(value('event_p90_ms'), '.2f')} |",
        f"| run finished to wait() | {mmm(wait_p50, '.2f')} | {mmm(value('wait_p90_ms'), '.2f')} |",
        "",
        f"{runs[0]['n']:,} runs each waiting for one event: all waiting after"
        f" {mmm(value('events_waiting_s'), '.2f')} s, the worker holding"
        f" {mmm(value('events_worker_threads'), '.0f')} threads; the events sent in one"
        f" transaction in {mmm(value('events_send_s'), '.2f')} s, then drained in"
        f" {mmm(value('events_drain_s'), '.2f')} s ({mmm(value('events_drain_per_s'))} runs/s).",
        "",
    ]


def every_system(rec: Records) -> list[str]:
    """A row per system measured: its drain rates, bulk enqueue, latency, foreign load."""
    values, pooled = rec.values, rec.pooled
    lines = [
        "## Every system",
        "",
        "| system | drain 1 process | drain 2 processes | drain 1p, DB timestamps"
        " | bulk enqueue | latency p50 / p90 ms | foreign load, cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in LABELS:
        if not any(r["system"] == system for r in rec.runs):
            continue
        label = LABELS[system] + drain_config(system, rec.meta)
        lat = (
            f"{fmt(pooled(system, 50), '.1f')} / {fmt(pooled(system, 90), '.1f')}"
            if pooled(system, 50) is not None
            else "n/a"
        )
        lines.append(
            f"| {label} | {mmm(values(system, 'drain1', 'drain_per_s'))}"
            f" | {mmm(values(system, 'drain2', 'drain_per_s'))}"
            f" | {mmm(values(system, 'drain1', 'drain_db_per_s'))}"
            f" | {mmm(values(system, 'drain1', 'enqueue_per_s'))} | {lat}"
            f" | {mmm(values(system, 'drain1', 'foreign_cores'), '.2f')} |"
        )
    return lines


def error_lines(runs: list[dict[str, Any]]) -> list[str]:
    errors = [r for r in runs if "error" in r]
    if not errors:
        return []
    return [
        "",
        "Errors:",
        "",
        *(
            f"- round {r['round']}, {LABELS.get(r['system'], r['system'])} {r['case']}: "
            f"{r['error']}"
            for r in errors
        ),
    ]


# django_jobs' drain on MariaDB, against django-tasks-db's on the same server (issue target).
MARIADB_TARGET = 5.0


def summarize_mariadb(records: list[dict[str, Any]], raw_name: str) -> str:
    """The table of a --database mariadb run: django_jobs beside django-tasks-db."""
    rec = Records(records)
    values, ratio, pooled = rec.values, rec.ratio, rec.pooled
    dj, dt = "django_jobs", "django_tasks_db"

    def pair(case: str, key: str) -> list[float]:
        return ratio((dj, case, key), (dt, case, key))

    drain1 = pair("drain1", "drain_per_s")
    r1 = statistics.median(drain1) if drain1 else None
    met = "n/a" if r1 is None else ("yes" if r1 >= MARIADB_TARGET else "**no**")
    rows = [
        (
            "drain, 1 process (runs/s)",
            mmm(values(dj, "drain1", "drain_per_s")),
            mmm(values(dt, "drain1", "drain_per_s")),
            mmm(drain1, ".1f", TIMES),
            f"≥ {MARIADB_TARGET:.0f}{TIMES} django-tasks-db",
            met,
        ),
        (
            "drain, 2 processes (runs/s)",
            mmm(values(dj, "drain2", "drain_per_s")),
            mmm(values(dt, "drain2", "drain_per_s")),
            mmm(pair("drain2", "drain_per_s"), ".1f", TIMES),
            "",
            "",
        ),
        (
            "bulk enqueue (runs/s)",
            mmm(values(dj, "drain1", "enqueue_per_s")),
            mmm(values(dt, "drain1", "enqueue_per_s")),
            mmm(pair("drain1", "enqueue_per_s"), ".1f", TIMES),
            "",
            "",
        ),
        *(
            (
                f"idle latency p{pct} (ms, pooled)",
                fmt(pooled(dj, pct), ".1f"),
                fmt(pooled(dt, pct), ".1f"),
                "",
                "",
                "",
            )
            for pct in (50, 90)
        ),
        ("3-step run, 1 process (runs/s)", mmm(values(dj, "steps", "drain_per_s")), "", "", "", ""),
    ]
    lines = [
        "# Benchmark on MariaDB: django_jobs beside django-tasks-db",
        "",
        *machine_lines(rec.meta, raw_name),
        "",
        f"Median (min{DASH}max) over rounds; ratios are taken within each round, then their"
        " median. Latency percentiles pool every sample of every round.",
        "",
        "| metric | django_jobs | django-tasks-db | django_jobs / django-tasks-db | target | met |",
        "|---|---|---|---|---|---|",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        *ratelimit_section(rec),
        *held_section(rec),
        *events_section(rec, polled=True),
        *every_system(rec),
        "",
        "django_jobs, more: "
        f"3-step runs by DB timestamps {mmm(values(dj, 'steps', 'drain_db_per_s'))} runs/s. "
        "The MariaDB server's CPU during django_jobs' drain1 (cores, all its clients): "
        f"{mmm(values(dj, 'drain1', 'db_server_cores'), '.2f')}; "
        f"during django-tasks-db's: {mmm(values(dt, 'drain1', 'db_server_cores'), '.2f')}.",
        *per_round_mariadb(rec),
        *error_lines(rec.runs),
    ]
    return "\n".join(lines) + "\n"


def per_round_mariadb(rec: Records) -> list[str]:
    """Each round's drain rates and ratios, with the loads during them."""
    dj, dt = "django_jobs", "django_tasks_db"
    rounds = sorted({r["round"] for r in rec.ok})
    if not rounds:
        return []
    cells = [
        (dj, "drain1", "drain_per_s", ",.0f"),
        (dt, "drain1", "drain_per_s", ",.0f"),
        (dj, "drain2", "drain_per_s", ",.0f"),
        (dt, "drain2", "drain_per_s", ",.0f"),
        (dj, "steps", "drain_per_s", ",.0f"),
        (dj, "drain1", "foreign_cores", ".2f"),
        (dj, "drain1", "db_server_cores", ".2f"),
    ]
    columns = [rec.by_round(system, case, key) for system, case, key, _ in cells]
    ratio_rounds = [
        rec.ratio_by_round((dj, case, "drain_per_s"), (dt, case, "drain_per_s"))
        for case in ("drain1", "drain2")
    ]
    lines = [
        "",
        "Round by round (runs/s; loads in cores during django_jobs' drain1):",
        "",
        "| round | django_jobs drain 1p | django-tasks-db drain 1p | ratio"
        " | django_jobs drain 2p | django-tasks-db drain 2p | ratio | 3-step runs/s"
        " | foreign load | MariaDB server |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rnd in rounds:
        row = [fmt(col.get(rnd), spec) for col, (*_, spec) in zip(columns, cells, strict=True)]
        r1, r2 = (fmt(rr.get(rnd), ".1f", TIMES) for rr in ratio_rounds)
        lines.append(
            f"| {rnd} | {row[0]} | {row[1]} | {r1} | {row[2]} | {row[3]} | {r2}"
            f" | {row[4]} | {row[5]} | {row[6]} |"
        )
    return lines


def per_round(ok: list[dict[str, Any]]) -> list[str]:
    """django_jobs' ratios round by round, with the foreign load during its drains."""
    rows: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
    for r in ok:
        rows.setdefault(r["round"], {})[(r["system"], r["case"])] = r
    if not rows:
        return []

    def get(rnd: int, system: str, case: str, key: str) -> float | None:
        return rows[rnd].get((system, case), {}).get(key)

    def div(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a is not None and b else "n/a"

    dj, pgq = "django_jobs", "pgqueuer"
    lines = [
        "",
        "Round by round (django_jobs / PgQueuer; history / empty; foreign load in cores during"
        " django_jobs' drain1 / history drain):",
        "",
        "| round | drain 1p | drain 2p | bulk enqueue | history / empty | 3-step runs/s"
        " | foreign load |",
        "|---|---|---|---|---|---|---|",
    ]
    pairs = [
        ((dj, "drain1", "drain_per_s"), (pgq, "drain1", "drain_per_s")),
        ((dj, "drain2", "drain_per_s"), (pgq, "drain2", "drain_per_s")),
        ((dj, "drain1", "enqueue_per_s"), (pgq, "drain1", "enqueue_per_s")),
        ((dj, "history", "drain_per_s"), (dj, "drain1", "drain_per_s")),
    ]
    for rnd in sorted(rows):
        ratios = [div(get(rnd, *a), get(rnd, *b)) for a, b in pairs]
        steps = fmt(get(rnd, dj, "steps", "drain_per_s"))
        loads = " / ".join(
            fmt(get(rnd, dj, c, "foreign_cores"), ".2f") for c in ("drain1", "history")
        )
        lines.append(f"| {rnd} | {' | '.join(ratios)} | {steps} | {loads} |")
    return lines


def machine_lines(meta: dict[str, Any], raw_name: str) -> list[str]:
    if not meta:
        return []
    opts = meta["options"]
    versions = meta["versions"]
    pkgs = "; ".join(
        f"{LABELS[s]}: " + ", ".join(f"{k} {v}" for k, v in vs.items() if k != "python")
        for s, vs in versions.items()
    )
    python = sorted({vs["python"] for vs in versions.values()})
    verbosity = opts["worker_verbosity"]
    io = f"; io: {opts['io_n']:,} runs, {opts['io_concurrency']} at once" if "io_n" in opts else ""
    return [
        f"- Date: {meta['date']}; django_jobs at `{meta['django_jobs_commit']}`; raw: `{raw_name}`",
        f"- Machine: {meta['nproc']} CPUs ({meta['cpu']}), {meta['ram_gib']} GiB RAM, "
        f"Linux {meta['kernel']}; {server_name(meta)} (local, shared with other work)",
        f"- Python {', '.join(python)}; {pkgs}",
        f"- {opts['rounds']} round(s); {opts['n']:,} no-op runs per drain; runjobworker "
        f"{worker_flags(opts['concurrency'])}, "
        + ("default verbosity" if verbosity is None else f"-v {verbosity}")
        + f"; {opts['lat_samples']} latency samples per system and round{io}"
        + (" (**quick mode**: smoke test, not for comparisons)" if opts["quick"] else ""),
    ]


def server_name(meta: dict[str, Any]) -> str:
    if "mariadb" in meta:
        return f"MariaDB {meta['mariadb']}"
    return f"PostgreSQL {meta['postgresql']}"


def drain_config(system: str, meta: dict[str, Any]) -> str:
    conc = meta.get("options", {}).get("concurrency", "?")
    return {
        "django_jobs": f" ({worker_flags(conc)})",
        "pgqueuer": " (defaults, batch 10)",
        "procrastinate": " (--concurrency 10)",
        "django_tasks_db": " (db_worker)",
    }[system]


def worker_flags(conc: object) -> str:
    return "no --concurrency (its default)" if conc == "default" else f"--concurrency {conc}"


def drain_verdict(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1.5:
        return "yes"
    return "floor only" if value >= 1.0 else "**no**"


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def fmt(value: float | None, spec: str = ",.0f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def mmm(vals: Sequence[float], spec: str = ",.0f", unit: str = "") -> str:
    """Median (min-max)."""
    if not vals:
        return "n/a"
    med = fmt(statistics.median(vals), spec, unit)
    if len(vals) == 1:
        return med
    return f"{med} ({fmt(min(vals), spec)}{DASH}{fmt(max(vals), spec)})"
