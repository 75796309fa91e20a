#!/usr/bin/env python3
"""django_jobs beside its peers, on this machine, in one run, interleaved by round.

    python3 bench/run.py                  # 3 rounds, 20,000 runs per drain (~21 min)
    python3 bench/run.py --quick          # smoke run: 1 round, small N (~105 s)
    python3 bench/run.py --rounds 5 --n 20000 --concurrency 16
    python3 bench/run.py --concurrency default   # runjobworker without --concurrency
    python3 bench/run.py --database mariadb      # django_jobs and django-tasks-db on MariaDB
    python3 bench/run.py --only django_jobs:io,pgqueuer:io,procrastinate:io   # I/O-bound
    python3 bench/run.py --only django_jobs:ratelimit   # a job under rate_limit="20/s"
    python3 bench/run.py --only django_jobs:held   # beside 100,000 runs no claim can take

Each system (django_jobs, PgQueuer, Procrastinate, django-tasks-db) gets its own
virtual environment under bench/.venvs/ (created on first use; --reinstall rebuilds)
and its own scratch database, recreated for every measurement. Every round runs every
case of every system once (bench/peers/<system>_bench.py, one process per case); the
raw records go to bench/results/<timestamp>.jsonl and the table to
bench/results/summary.md (summary-quick.md with --quick; summary-mariadb.md and
summary-mariadb-quick.md with --database mariadb). This script needs only the
standard library; see bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

from summary import LABELS, write_summary

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
PEERS = os.path.join(BENCH, "peers")
VENVS = os.path.join(BENCH, ".venvs")
RESULTS = os.path.join(BENCH, "results")
CONSTRAINTS = os.path.join(PEERS, "constraints.txt")

# What each system's venv holds (versions pinned by constraints.txt). psycopg is the
# harness's own (bench/peers/common.py) where the library does not need it.
# MariaDB's client, added to a venv the first time it is used with --database mariadb.
MARIADB_PACKAGES = ["mysqlclient"]
DATABASES = ("postgresql", "mariadb")
PACKAGES = {
    "django_jobs": ["-e", f"{REPO}[postgres]", "psycopg[binary]", "Django", "django-environ"],
    "pgqueuer": ["pgqueuer", "asyncpg", "uvloop", "psycopg[binary]"],
    "procrastinate": ["procrastinate", "psycopg[binary]"],
    "django_tasks_db": ["django-tasks-db", "Django", "psycopg[binary]"],
}
VERSIONS = {
    "django_jobs": ["Django", "psycopg"],
    "pgqueuer": ["pgqueuer", "asyncpg", "uvloop"],
    "procrastinate": ["procrastinate", "psycopg"],
    "django_tasks_db": ["django-tasks-db", "Django", "psycopg"],
}
# One round, in this order: the pairs compared by ratio run next to each other.
PLAN = [
    ("pgqueuer", "drain1"),
    ("django_jobs", "drain1"),
    ("pgqueuer", "drain2"),
    ("django_jobs", "drain2"),
    ("django_jobs", "steps"),
    ("django_jobs", "history"),
    ("django_jobs", "rss"),
    ("procrastinate", "drain1"),
    ("django_tasks_db", "drain1"),
    ("django_tasks_db", "drain2"),
    # The I/O-bound case: 0.1 s of asyncio.sleep per run, C runs at once.
    ("pgqueuer", "io"),
    ("django_jobs", "io"),
    ("procrastinate", "io"),
    # A no-op under a rate limit (bound by the limit, not by the machine).
    ("django_jobs", "ratelimit"),
    # Drains beside a backlog of runs the claim cannot take.
    ("django_jobs", "held"),
    # Events into runs and callers waiting for runs.
    ("django_jobs", "events"),
]
# The round on MariaDB: the cases that run there. PgQueuer and Procrastinate are
# PostgreSQL queues; django_jobs' history, rss and io cases are written for PostgreSQL.
MARIADB_PLAN = [
    ("django_tasks_db", "drain1"),
    ("django_jobs", "drain1"),
    ("django_tasks_db", "drain2"),
    ("django_jobs", "drain2"),
    ("django_jobs", "steps"),
    ("django_jobs", "ratelimit"),
    ("django_jobs", "held"),
    ("django_jobs", "events"),
]
CASES = {
    "django_jobs": [
        "drain1",
        "drain2",
        "steps",
        "history",
        "rss",
        "io",
        "ratelimit",
        "held",
        "events",
    ],
    "pgqueuer": ["drain1", "drain2", "io"],
    "procrastinate": ["drain1", "drain2", "io"],
    "django_tasks_db": ["drain1", "drain2"],
}
CASE_TIMEOUT = 1800  # seconds; a driver still running then is stopped
# The io case's runs unless --n is given: the figure (at --io-concurrency 500
# ten waves of 0.1 s); --quick: 1,000, as Procrastinate takes ~20 s over 5,000.
IO_N, IO_N_QUICK = 5000, 1000
# The events case's runs waiting for one event each, unless --n is given (issue 30).
EVENTS_N, EVENTS_N_QUICK = 10000, 1000
# The ratelimit case's runs (--ratelimit-runs; not --n: at 20/s every 1,000 runs take
# 50 s): 600 at 20 a second, ~30 s, as tests/process/test_rate_limits_process.py;
# --quick: 200, ~10 s.
RATELIMIT_N, RATELIMIT_N_QUICK = 600, 200


def main() -> None:
    args = parse_args()
    # Stop cleanly (workers, scratch databases) on Ctrl-C and on SIGTERM alike.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupted)
    os.makedirs(RESULTS, exist_ok=True)
    if args.summarize:
        records = load_records(args.summarize)
        print(write_summary(records, args.summarize, quick=args.quick))
        return
    plan = build_plan(args.only, args.database)
    systems = list(dict.fromkeys(system for system, _ in plan))
    for system in systems:
        ensure_venv(system, args.reinstall, args.database)
    if args.setup_only:
        return
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = ("-mariadb" if args.database == "mariadb" else "") + ("-quick" if args.quick else "")
    raw_path = os.path.join(RESULTS, f"{stamp}{suffix}.jsonl")
    meta = machine_info(systems, args)
    append(raw_path, meta)
    print(f"raw records: {os.path.relpath(raw_path, REPO)}", flush=True)
    started = time.monotonic()
    try:
        for rnd in range(1, args.rounds + 1):
            print(f"=== round {rnd}/{args.rounds} ({elapsed(started)})", flush=True)
            for system, case in plan:
                record = run_case(system, case, rnd, args)
                append(raw_path, record)
                print(f"  {LABELS[system]:<16} {case:<8} {brief(record)}", flush=True)
                if "limit_violation" in record:
                    print(f"  !!! RATE LIMIT VIOLATED: {record['limit_violation']}", flush=True)
    finally:
        dropped = drop_scratch_dbs(systems[0], args.database)
        if dropped:
            print(f"dropped scratch databases: {dropped}")
    print(f"total {elapsed(started)}")
    records = load_records(raw_path)
    print(write_summary(records, raw_path, quick=args.quick))
    violations = [
        f"round {r['round']}: {r['limit_violation']}" for r in records if "limit_violation" in r
    ]
    if violations:
        sys.exit("RATE LIMIT VIOLATED (the ratelimit case): " + "; ".join(violations))


def build_plan(only: str | None, database: str = "postgresql") -> list[tuple[str, str]]:
    """The cases of one round, in order: all of ``database``'s, or those ``only`` names."""
    base = PLAN if database == "postgresql" else MARIADB_PLAN
    skipped = [f"{s}:{c}" for s, c in PLAN if (s, c) not in base]
    if not only:
        if skipped:
            print(f"PostgreSQL only, not run on {database}: {', '.join(skipped)}", flush=True)
        return list(base)
    wanted: list[tuple[str, str]] = []
    for item in only.split(","):
        system, _, case = item.strip().partition(":")
        if system not in CASES or (case and case not in CASES[system]):
            known = ", ".join(f"{s}:{c}" for s in CASES for c in CASES[s])
            sys.exit(f"unknown case {item!r}; known: {known}")
        if database != "postgresql" and not any(s == system and case in ("", c) for s, c in base):
            served = ", ".join(f"{s}:{c}" for s, c in base)
            sys.exit(f"{item!r} runs on PostgreSQL only; on {database}: {served}")
        wanted.append((system, case))
    plan = [(s, c) for s, c in base if any(s == ws and wc in ("", c) for ws, wc in wanted)]
    not_run = [c for c in skipped if any(c.startswith(f"{ws}:") for ws, wc in wanted if not wc)]
    if not_run:
        print(f"PostgreSQL only, not run on {database}: {', '.join(not_run)}", flush=True)
    return plan + [(s, c) for s, c in wanted if c and (s, c) not in plan]


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def concurrency_option(value: str) -> str:
    """A positive integer, or 'default' (the worker is started without the flag)."""
    if value != "default" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'default', got {value!r}")
    return value


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick: 1)")
    p.add_argument(
        "--n",
        type=int,
        default=None,
        help=f"runs per drain (default 20000; --quick: 2000; the io case: {IO_N}; "
        f"--quick: {IO_N_QUICK})",
    )
    p.add_argument(
        "--concurrency",
        type=concurrency_option,
        default="16",
        help="runjobworker --concurrency N; 'default' passes no --concurrency (default 16)",
    )
    p.add_argument(
        "--io-concurrency",
        type=int,
        default=500,
        help="the io case's runs at once: runjobworker --async-concurrency, PgQueuer's "
        "max_concurrent_tasks, procrastinate worker --concurrency (default 500)",
    )
    p.add_argument(
        "--ratelimit-runs",
        type=int,
        default=None,
        help=f"the ratelimit case's runs (default {RATELIMIT_N}; --quick: {RATELIMIT_N_QUICK})",
    )
    p.add_argument(
        "--ratelimit-rate",
        type=int,
        default=20,
        help='the ratelimit case\'s limit R: rate_limit="R/s" (default 20)',
    )
    p.add_argument(
        "--ratelimit-workers",
        type=int,
        default=3,
        help="the ratelimit case's worker processes, of 4 threads each (default 3)",
    )
    p.add_argument(
        "--held-runs",
        type=int,
        default=None,
        help="the held case's backlog of runs no claim can take (100k; 10k)",
    )
    p.add_argument("--lat-samples", type=int, default=None, help="latency samples (25; 10)")
    p.add_argument("--history", type=int, default=None, help="completed rows (1M; 100k)")
    p.add_argument("--rss-runs", type=int, default=None, help="runs for the RSS case (100k; 10k)")
    p.add_argument(
        "--worker-verbosity",
        type=int,
        default=None,
        help="pass -v N to runjobworker (default: not passed, i.e. verbosity 1)",
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (small sizes, 1 round)")
    p.add_argument(
        "--database",
        choices=DATABASES,
        default="postgresql",
        help="the server: postgresql (default), or mariadb (django_jobs and django-tasks-db)",
    )
    p.add_argument(
        "--only",
        metavar="SYSTEM[:CASE],...",
        help="run a subset, e.g. django_jobs,pgqueuer:drain1 (procrastinate:drain2 is extra)",
    )
    p.add_argument("--reinstall", action="store_true", help="rebuild the virtual environments")
    p.add_argument("--setup-only", action="store_true", help="only create the venvs")
    p.add_argument("--summarize", metavar="JSONL", help="only rebuild the summary of a raw file")
    args = p.parse_args()
    for name in ("io_concurrency", "ratelimit_rate", "ratelimit_workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    quick = args.quick
    args.io_n = args.n if args.n is not None else (IO_N_QUICK if quick else IO_N)
    args.events_n = args.n if args.n is not None else (EVENTS_N_QUICK if quick else EVENTS_N)
    defaults = {
        "rounds": (3, 1),
        "n": (20000, 2000),
        "lat_samples": (25, 10),
        "history": (1_000_000, 100_000),
        "rss_runs": (100_000, 10_000),
        "ratelimit_runs": (RATELIMIT_N, RATELIMIT_N_QUICK),
        "held_runs": (100_000, 10_000),
    }
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    return args


# --- virtual environments ---------------------------------------------------------


def python312() -> str:
    explicit = os.environ.get("BENCH_PYTHON")
    if explicit:
        return explicit
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True
        ).stdout.strip()
        candidate = os.path.join(root, "versions", "3.12.1", "bin", "python")
        if os.path.exists(candidate):
            return candidate
    except (OSError, subprocess.CalledProcessError):
        pass
    found = shutil.which("python3.12")
    if not found:
        sys.exit("Python 3.12 not found: set BENCH_PYTHON")
    return found


def venv_python(system: str) -> str:
    return os.path.join(VENVS, system, "bin", "python")


def ensure_venv(system: str, reinstall: bool, database: str = "postgresql") -> None:
    """Create bench/.venvs/<system> unless it exists with the same package spec; on
    MariaDB, add its client unless it is there."""
    root = os.path.join(VENVS, system)
    with open(CONSTRAINTS, "rb") as f:
        constraints = hashlib.sha256(f.read()).hexdigest()
    pip = [venv_python(system), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    marker = os.path.join(root, ".bench-spec")
    spec = json.dumps(PACKAGES[system]) + constraints
    if reinstall or not has_spec(marker, spec):
        print(f"creating {os.path.relpath(root, REPO)} ...", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([python312(), "-m", "venv", root], check=True)
        subprocess.run([*pip, "-c", CONSTRAINTS, *PACKAGES[system]], check=True)
        with open(marker, "w") as f:
            f.write(spec)
    if database != "mariadb":
        return
    # A marker of its own, so that switching servers does not rebuild the venv.
    marker = os.path.join(root, ".bench-spec-mariadb")
    spec = json.dumps(MARIADB_PACKAGES) + constraints
    if not has_spec(marker, spec):
        print(f"adding {', '.join(MARIADB_PACKAGES)} to {os.path.relpath(root, REPO)} ...")
        subprocess.run([*pip, "-c", CONSTRAINTS, *MARIADB_PACKAGES], check=True)
        with open(marker, "w") as f:
            f.write(spec)


def has_spec(marker: str, spec: str) -> bool:
    try:
        with open(marker) as f:
            return f.read() == spec
    except FileNotFoundError:
        return False


def package_versions(system: str, database: str = "postgresql") -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys, platform;"
        "print(json.dumps({'python': platform.python_version(),"
        " **{p: m.version(p) for p in sys.argv[1:]}}))"
    )
    extra = MARIADB_PACKAGES if database == "mariadb" else []
    out = subprocess.run(
        [venv_python(system), "-c", code, *VERSIONS[system], *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


# --- running one case ---------------------------------------------------------------


def run_case(system: str, case: str, rnd: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one driver process; whatever happens, stop every worker it started."""
    fd, out = tempfile.mkstemp(prefix="bench_run_", suffix=".json")
    os.close(fd)
    pidfile = out + ".pids"
    cmd = [
        venv_python(system),
        os.path.join(PEERS, f"{system}_bench.py"),
        "--case",
        case,
        "--n",
        str(
            {"io": args.io_n, "ratelimit": args.ratelimit_runs, "events": args.events_n}.get(
                case, args.n
            )
        ),
        "--concurrency",
        str(args.concurrency),
        "--lat-samples",
        str(args.lat_samples),
        "--history",
        str(args.history),
        "--rss-runs",
        str(args.rss_runs),
        "--io-concurrency",
        str(args.io_concurrency),
        "--ratelimit-rate",
        str(args.ratelimit_rate),
        "--ratelimit-workers",
        str(args.ratelimit_workers),
        "--held-runs",
        str(args.held_runs),
        "--out",
        out,
    ]
    if args.worker_verbosity is not None:
        cmd += ["--worker-verbosity", str(args.worker_verbosity)]
    env = dict(
        helper_env(args.database),
        BENCH_PIDFILE=pidfile,
        BENCH_LOG_DIR=os.path.join(RESULTS, "logs"),
    )
    record: dict[str, Any] = {"system": system, "case": case, "round": rnd, "ts": time.time()}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=PEERS, env=env, start_new_session=True)
    try:
        proc.wait(CASE_TIMEOUT)
    except BaseException as exc:  # timeout, Ctrl-C: stop the driver first
        stop_groups([proc.pid])
        proc.wait()
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        record["error"] = f"driver timed out after {CASE_TIMEOUT} s"
    finally:
        leftovers = stop_groups(read_pids(pidfile))
        text = read_and_remove(out)
        read_and_remove(pidfile)
    record["case_s"] = round(time.monotonic() - t0, 1)
    if leftovers:
        record["stopped_leftover_workers"] = leftovers
    if text:
        record.update(json.loads(text))
    elif "error" not in record:
        record["error"] = f"driver exited with {proc.returncode} and wrote nothing"
    return record


def read_and_remove(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def read_pids(path: str) -> list[int]:
    try:
        with open(path) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def stop_groups(pgids: Iterable[int], timeout: float = 15.0) -> list[int]:
    """SIGTERM the process groups still alive, SIGKILL them after ``timeout``; returns
    those that needed the SIGKILL or had not stopped on their own."""
    live = [g for g in pgids if group_alive(g)]
    for pgid in live:
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    stopping = list(live)
    while stopping and time.monotonic() < deadline:
        time.sleep(0.1)
        stopping = [g for g in stopping if group_alive(g)]
    for pgid in stopping:
        signal_group(pgid, signal.SIGKILL)
    return live


def group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def helper_env(database: str) -> dict[str, str]:
    """The environment of a driver or of a bench/peers/common.py helper."""
    return dict(os.environ, PYTHONPATH=PEERS, BENCH_DATABASE=database)


def drop_scratch_dbs(system: str, database: str) -> str:
    """Drop every bench_run_* database, and remove the latency probes' files."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "bench_run_*_lat.txt")):
        os.remove(path)
    out = subprocess.run(
        [venv_python(system), os.path.join(PEERS, "common.py"), "drop-scratch-dbs"],
        capture_output=True,
        text=True,
        cwd=PEERS,
        env=helper_env(database),
    )
    return out.stdout.strip() or out.stderr.strip()


# --- records ----------------------------------------------------------------------


def machine_info(systems: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    server = subprocess.run(
        [venv_python(systems[0]), os.path.join(PEERS, "common.py"), "server-version"],
        capture_output=True,
        text=True,
        cwd=PEERS,
        env=helper_env(args.database),
    ).stdout.strip()
    # Records of PostgreSQL runs keep the key they always had.
    database = {"postgresql": server} if args.database == "postgresql" else {"mariadb": server}
    git = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    return {
        "system": "meta",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        **database,
        "django_jobs_commit": git,
        "versions": {s: package_versions(s, args.database) for s in systems},
        "options": {
            k: getattr(args, k)
            for k in (
                "rounds",
                "n",
                "concurrency",
                "lat_samples",
                "history",
                "rss_runs",
                "io_n",
                "events_n",
                "io_concurrency",
                "ratelimit_runs",
                "ratelimit_rate",
                "ratelimit_workers",
                "held_runs",
            )
        }
        | {"worker_verbosity": args.worker_verbosity, "quick": args.quick},
    }


def append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load_records(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def brief(record: dict[str, Any]) -> str:
    if "error" in record:
        return f"ERROR {record['error']} ({record['case_s']} s)"
    keys = [
        ("enqueue_per_s", "enqueue/s"),
        ("drain_per_s", "drain/s"),
        ("drain_db_per_s", "db/s"),
        ("lat_p50_ms", "p50 ms"),
        ("lat_p90_ms", "p90 ms"),
        ("rss_growth_mb", "RSS +MB"),
        ("span_s", "span s"),
        ("span_over_ideal", "span/ideal"),
        ("most_in_a_second", "most in a second"),
        ("wall_s", "wall s"),
        ("max_connections", "max conns"),
        ("foreign_cores", "foreign cores"),
    ]
    parts = [f"{label} {record[k]:,}" for k, label in keys if record.get(k) is not None]
    return ", ".join(parts) + f" ({record['case_s']} s)"


def elapsed(started: float) -> str:
    s = int(time.monotonic() - started)
    return f"{s // 60}m{s % 60:02d}s"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as exc:
        sys.exit(f"interrupted ({exc or 'SIGINT'}); workers stopped, scratch databases dropped")
