"""Cron parsing, next ticks (month ends, leap years, DST), Schedule, missed ticks, checks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_jobs import Schedule, job
from django_jobs.checks import check_schedules
from django_jobs.cron import parse, wall_to_instant
from django_jobs.registry import all_handlers, unregister
from django_jobs.schedules import CATCH_UP_LIMIT, entries, idempotency_key, plan

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def ticks(expression: str, start: datetime, count: int, zone: Any = UTC) -> list[datetime]:
    cron, found, tick = parse(expression), [], start
    for _ in range(count):
        tick = cron.next_after(tick, zone)
        found.append(tick)
    return found


# --- parsing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "field", "expected"),
    [
        ("* * * * *", "minutes", tuple(range(60))),
        ("5 * * * *", "minutes", (5,)),
        ("1,2,3 * * * *", "minutes", (1, 2, 3)),
        ("10-13 * * * *", "minutes", (10, 11, 12, 13)),
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("1-10/4 * * * *", "minutes", (1, 5, 9)),
        ("50/5 * * * *", "minutes", (50, 55)),
        ("0,30-32,*/20 * * * *", "minutes", (0, 20, 30, 31, 32, 40)),
        ("0 */6 * * *", "hours", (0, 6, 12, 18)),
        ("0 0 * jan,JUL *", "months", (1, 7)),
        ("0 0 * mar-may *", "months", (3, 4, 5)),
        ("0 0 * */3 *", "months", (1, 4, 7, 10)),
    ],
)
def test_field_forms(expression: str, field: str, expected: tuple[int, ...]) -> None:
    assert getattr(parse(expression), field) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mon-fri", {1, 2, 3, 4, 5}),
        ("0", {0}),
        ("7", {0}),  # 7 is Sunday too
        ("sun,sat", {0, 6}),
        ("5-7", {5, 6, 0}),
        ("fri-sun", {5, 6, 0}),
        ("*/2", {0, 2, 4, 6}),
        ("Tue", {2}),
    ],
)
def test_weekday_forms(text: str, expected: set[int]) -> None:
    assert parse(f"0 0 * * {text}").weekdays == expected


@pytest.mark.parametrize(
    ("macro", "same_as"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
    ],
)
def test_macros(macro: str, same_as: str) -> None:
    start = utc(2026, 2, 27, 13, 17)
    assert ticks(macro, start, 3) == ticks(same_as, start, 3)
    assert str(parse(macro)) == macro


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "expected 5 fields (minute hour day-of-month month day-of-week), got 0"),
        ("* * * *", "got 4"),
        ("* * * * * *", "got 6"),
        ("60 * * * *", "minute 60 is out of range (0-59)"),
        ("* 24 * * *", "hour 24 is out of range (0-23)"),
        ("* * 0 * *", "day of month 0 is out of range (1-31)"),
        ("* * * 13 *", "month 13 is out of range (1-12)"),
        ("* * * * 8", "day of week 8 is out of range (0-7)"),
        ("*/0 * * * *", "minute step must be at least 1"),
        ("5-1 * * * *", "minute range '5-1' runs backwards"),
        ("x * * * *", "minute value 'x' is not a number"),
        ("-1 * * * *", "minute value '' is not a number"),
        ("1,,2 * * * *", "minute value '' is not a number"),
        ("*/x * * * *", "minute step 'x' is not a number"),
        ("* * * foo *", "month value 'foo' is not a number or a name (jan, feb"),
        ("* * * * mon-xyz", "day of week value 'xyz' is not a number or a name (sun, mon"),
        ("mon * * * *", "minute value 'mon' is not a number"),
        ("? * * * *", "minute value '?' is not a number"),
        ("@reboot", "unknown macro '@reboot'; use one of @yearly"),
        ("0 0 30 2 *", "no date matches its day and month fields: it never fires"),
        ("0 0 31 4,6,9,11 *", "it never fires"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid cron expression") as error:
        parse(expression)
    assert repr(expression) in str(error.value)
    assert message in str(error.value)


def test_a_cron_expression_must_be_text() -> None:
    with pytest.raises(TypeError, match="must be a string, got 5"):
        parse(5)  # type: ignore[arg-type]


# --- next ticks ---------------------------------------------------------------------


def test_next_tick_is_strictly_after_the_instant() -> None:
    cron = parse("*/5 * * * *")
    assert cron.next_after(utc(2026, 1, 1, 10, 0), UTC) == utc(2026, 1, 1, 10, 5)
    assert cron.next_after(utc(2026, 1, 1, 10, 4, 59), UTC) == utc(2026, 1, 1, 10, 5)
    assert cron.next_after(utc(2026, 1, 1, 10, 5, 0, 1), UTC) == utc(2026, 1, 1, 10, 10)


def test_next_tick_crosses_hour_day_month_and_year_ends() -> None:
    assert ticks("30 23 * * *", utc(2026, 12, 31, 23, 30), 2) == [
        utc(2027, 1, 1, 23, 30),
        utc(2027, 1, 2, 23, 30),
    ]
    assert ticks("0 0 31 * *", utc(2026, 1, 31, 1), 3) == [
        utc(2026, 3, 31),  # February and April have no 31st
        utc(2026, 5, 31),
        utc(2026, 7, 31),
    ]
    assert ticks("0 12 1 */6 *", utc(2026, 2, 1), 2) == [utc(2026, 7, 1, 12), utc(2027, 1, 1, 12)]


def test_february_29_waits_for_leap_years() -> None:
    assert ticks("0 0 29 2 *", utc(2025, 1, 1), 3) == [
        utc(2028, 2, 29),
        utc(2032, 2, 29),
        utc(2036, 2, 29),
    ]
    # 2100 is not a leap year: eight years between two ticks.
    assert ticks("0 0 29 2 *", utc(2096, 3, 1), 1) == [utc(2104, 2, 29)]
    assert ticks("0 0 L * *".replace("L", "28-31"), utc(2028, 2, 27), 3) == [
        utc(2028, 2, 28),
        utc(2028, 2, 29),
        utc(2028, 3, 28),
    ]


def test_restricted_day_fields_fire_on_either() -> None:
    # The 13th, and every Friday (2026-03-06 is a Friday).
    assert ticks("0 0 13 * fri", utc(2026, 3, 1), 4) == [
        utc(2026, 3, 6),
        utc(2026, 3, 13),
        utc(2026, 3, 20),
        utc(2026, 3, 27),
    ]
    # One day field given: it alone decides.
    assert ticks("0 0 * * fri", utc(2026, 3, 1), 2) == [utc(2026, 3, 6), utc(2026, 3, 13)]
    assert ticks("0 0 13 * *", utc(2026, 3, 1), 1) == [utc(2026, 3, 13)]
    # A field starting with * is unrestricted (Vixie cron): odd days that are Fridays.
    assert ticks("0 0 */2 * fri", utc(2026, 3, 1), 2) == [utc(2026, 3, 13), utc(2026, 3, 27)]


def test_weekday_7_and_names_fire_on_sundays() -> None:
    sundays = [utc(2026, 3, 1), utc(2026, 3, 8)]
    for text in ("0", "7", "sun", "SUN"):
        assert ticks(f"0 0 * * {text}", utc(2026, 2, 28), 2) == sundays


def test_ticks_many_years_apart_are_found() -> None:
    # February 29 that is a Sunday ("*/7" is unrestricted: both fields must match).
    assert ticks("0 0 29 2 */7", utc(2026, 1, 1), 3) == [
        utc(2032, 2, 29),
        utc(2060, 2, 29),
        utc(2088, 2, 29),
    ]
    # February 29, or any Monday of February (both fields restricted: either).
    assert ticks("0 0 29 2 1", utc(2027, 2, 20), 4) == [
        utc(2027, 2, 22),
        utc(2028, 2, 7),
        utc(2028, 2, 14),
        utc(2028, 2, 21),
    ]
    assert ticks("0 0 29 2 1", utc(2028, 2, 27), 2) == [utc(2028, 2, 28), utc(2028, 2, 29)]


def test_an_expression_that_never_fires_is_refused_not_searched_forever() -> None:
    with pytest.raises(ValueError, match="it never fires"):
        parse("0 0 31 4,6,9,11 *")
    # Made without parse(): the search gives up after the 400-year calendar cycle.
    never = replace(parse("0 0 30 * *"), months=(2,))
    assert never.next_wall(datetime(2026, 1, 1)) is None
    with pytest.raises(ValueError, match="cron '0 0 30 \\* \\*' never fires"):
        never.next_after(utc(2026, 1, 1), UTC)


def test_far_ticks_are_found_without_walking_every_minute() -> None:
    # Once a year: a minute-by-minute search would take half a million steps per tick.
    assert ticks("59 23 31 12 *", utc(2026, 1, 1), 50)[-1] == utc(2075, 12, 31, 23, 59)


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        parse("* * * * *").next_after(datetime(2026, 1, 1), UTC)


# --- time zones and DST -----------------------------------------------------------


def test_fields_match_wall_time_in_the_zone() -> None:
    # 03:00 in Paris is 02:00 UTC in winter and 01:00 UTC in summer.
    assert ticks("0 3 * * *", utc(2026, 3, 27), 3, PARIS) == [
        utc(2026, 3, 27, 2),
        utc(2026, 3, 28, 2),
        utc(2026, 3, 29, 1),  # the clocks went forward that night, at 02:00
    ]


def test_paris_spring_forward_gap_fires_once_at_its_end() -> None:
    # 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist.
    assert wall_to_instant(datetime(2026, 3, 29, 2, 30), PARIS) == utc(2026, 3, 29, 1)
    assert ticks("30 2 * * *", utc(2026, 3, 28), 3, PARIS) == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),  # at the end of the gap: 03:00 CEST
        utc(2026, 3, 30, 0, 30),
    ]
    # Every tick in the gap (and 03:00 itself) lands on one instant: one run, not five.
    assert ticks("*/15 2,3 * * *", utc(2026, 3, 29, 0, 50), 3, PARIS) == [
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 15),
        utc(2026, 3, 29, 1, 30),
    ]


def test_hourly_over_paris_spring_forward_has_23_ticks() -> None:
    day = ticks("0 * * * *", utc(2026, 3, 28, 22, 30), 30, PARIS)
    that_day = [t for t in day if t.astimezone(PARIS).date().isoformat() == "2026-03-29"]
    assert len(that_day) == 23
    assert [t.astimezone(PARIS).hour for t in that_day][:4] == [0, 1, 3, 4]


def test_new_york_fall_back_fires_the_repeated_time_once() -> None:
    # 2026-11-01: 02:00 EDT becomes 01:00 EST; 01:30 happens at 05:30 and 06:30 UTC.
    assert ticks("30 1 * * *", utc(2026, 10, 31, 12), 2, NEW_YORK) == [
        utc(2026, 11, 1, 5, 30),  # the first 01:30 (EDT)
        utc(2026, 11, 2, 6, 30),  # and not the second, an hour later
    ]
    # Asked during the second 01:xx hour, the next 01:30 is the next day's.
    assert ticks("30 1 * * *", utc(2026, 11, 1, 6, 10), 1, NEW_YORK) == [utc(2026, 11, 2, 6, 30)]


def test_half_hourly_over_new_york_fall_back_skips_the_repeated_hour() -> None:
    assert ticks("*/30 * * * *", utc(2026, 11, 1, 4, 45), 5, NEW_YORK) == [
        utc(2026, 11, 1, 5, 0),  # 01:00 EDT
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT
        utc(2026, 11, 1, 7, 0),  # 02:00 EST: 01:00 and 01:30 EST already fired
        utc(2026, 11, 1, 7, 30),
        utc(2026, 11, 1, 8, 0),
    ]


def test_new_york_spring_forward_and_utc_has_no_gaps() -> None:
    # 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00 UTC).
    assert ticks("15 2 * * *", utc(2026, 3, 7, 12), 2, NEW_YORK) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 9, 6, 15),
    ]
    assert len(ticks("0 * * * *", utc(2026, 3, 28), 48, UTC)) == 48


# --- Schedule -----------------------------------------------------------------------


def test_schedule_defaults_to_settings_time_zone(settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    schedule = Schedule("0 3 * * *")
    assert (schedule.timezone, schedule.zone.key, schedule.missed, schedule.input) == (
        None,
        "Europe/Paris",
        "skip",
        {},
    )
    assert schedule.next_after(utc(2026, 1, 1)) == utc(2026, 1, 1, 2)
    assert Schedule("0 3 * * *", timezone=ZoneInfo("Asia/Tokyo")).timezone == "Asia/Tokyo"


@pytest.mark.parametrize(("given", "stored"), [(None, {}), ([], []), (0, 0), ("x", "x")])
def test_schedule_input_is_any_json_value_as_with_start(given: Any, stored: Any) -> None:
    assert Schedule("* * * * *", input=given).input == stored


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cron": "61 * * * *"}, ValueError, "invalid cron expression '61 * * * *'"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, ValueError, "'Mars/Olympus'"),
        ({"cron": "* * * * *", "timezone": "../etc"}, ValueError, "unknown time zone '../etc'"),
        ({"cron": "* * * * *", "missed": "all"}, ValueError, "got 'all'"),
        ({"cron": "* * * * *", "input": {"x": object()}}, ValueError, "not JSON-serializable"),
        ({"cron": "* * * * *", "input": {1, 2}}, ValueError, "not JSON-serializable"),
    ],
)
def test_schedule_rejects_bad_values(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        Schedule(**kwargs)
    assert message in str(raised.value)


@pytest.fixture
def registered() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        unregister(name)


def test_job_takes_a_cron_string_or_a_schedule(registered: list[str]) -> None:
    registered += ["unit.nightly", "unit.weekly"]

    @job("unit.nightly", schedule="0 3 * * *")
    def nightly(ctx: object) -> None:
        return None

    @job("unit.weekly", pool="reports", schedule=Schedule("@weekly", missed="catch_up"))
    def weekly(ctx: object) -> None:
        return None

    assert nightly.schedule == Schedule("0 3 * * *")
    found = {e.name: e for e in entries(all_handlers())}
    assert (found["unit.weekly"].pool, found["unit.weekly"].schedule.missed) == (
        "reports",
        "catch_up",
    )
    assert [e.name for e in entries(all_handlers(), ["reports"])] == ["unit.weekly"]


def test_job_with_a_bad_schedule_fails_at_import() -> None:
    with pytest.raises(ValueError, match=r"invalid cron expression '0 25 \* \* \*'"):
        job("unit.bad", schedule="0 25 * * *")
    with pytest.raises(TypeError, match="schedule must be a cron string or a Schedule, got 5"):
        job("unit.bad", schedule=5)  # type: ignore[arg-type]


def test_idempotency_key_names_the_utc_instant() -> None:
    tick = datetime(2026, 3, 29, 3, tzinfo=PARIS)
    assert (
        idempotency_key("reports.nightly", tick) == "schedule:reports.nightly:2026-03-29T01:00:00Z"
    )


# --- which ticks run --------------------------------------------------------------


def test_a_tick_on_time_runs_under_either_policy() -> None:
    for missed in ("skip", "catch_up"):
        schedule = Schedule("*/5 * * * *", timezone="UTC", missed=missed)
        decided = plan(schedule, utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 5, 30))
        assert decided.run == [utc(2026, 1, 1, 10, 5)]
        assert (decided.latest, decided.missed) == (utc(2026, 1, 1, 10, 5), 0)


def test_nothing_due_plans_nothing() -> None:
    decided = plan(Schedule("0 * * * *"), utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 59))
    assert (decided.run, decided.latest, decided.missed) == ([], None, 0)


def test_skip_runs_no_missed_tick_but_the_one_on_time() -> None:
    schedule = Schedule("*/10 * * * *", timezone="UTC")
    late = plan(schedule, utc(2026, 1, 1, 10), utc(2026, 1, 1, 11, 0, 40))
    assert (late.run, late.latest, late.missed) == ([utc(2026, 1, 1, 11)], utc(2026, 1, 1, 11), 5)
    # More than MISSED_AFTER (60 s) late: missed too.
    later = plan(schedule, utc(2026, 1, 1, 10), utc(2026, 1, 1, 11, 1, 1))
    assert (later.run, later.latest, later.missed) == ([], utc(2026, 1, 1, 11), 6)


def test_catch_up_runs_every_missed_tick_oldest_first() -> None:
    schedule = Schedule("*/10 * * * *", timezone="UTC", missed="catch_up")
    decided = plan(schedule, utc(2026, 1, 1, 10), utc(2026, 1, 1, 10, 45))
    assert decided.run == [utc(2026, 1, 1, 10, m) for m in (10, 20, 30, 40)]
    assert (decided.latest, decided.missed) == (utc(2026, 1, 1, 10, 40), 0)


def test_catch_up_after_years_keeps_the_latest_ticks_only() -> None:
    schedule = Schedule("* * * * *", timezone="UTC", missed="catch_up")
    now = utc(2026, 1, 1, 12, 0, 30)
    decided = plan(schedule, utc(2020, 1, 1), now)  # three million minutes
    assert len(decided.run) == CATCH_UP_LIMIT
    assert decided.run[-1] == decided.latest == utc(2026, 1, 1, 12, 0)
    assert decided.run[0] == utc(2026, 1, 1, 12, 0) - timedelta(minutes=CATCH_UP_LIMIT - 1)
    # Six years (2,192 days) and twelve hours of minutes, all but the latest 100.
    minutes = 2_192 * 1_440 + 12 * 60
    assert decided.missed == minutes - CATCH_UP_LIMIT
    skipped = plan(Schedule("* * * * *", timezone="UTC"), utc(2020, 1, 1), now)
    assert (skipped.run, skipped.latest) == ([utc(2026, 1, 1, 12, 0)], utc(2026, 1, 1, 12, 0))
    assert skipped.missed == minutes - 1  # all but the latest, on time
    # The latest hourly tick is five minutes late too: all are skipped.
    hourly = plan(Schedule("0 * * * *", timezone="UTC"), utc(2020, 1, 1), utc(2026, 1, 1, 12, 5))
    assert (hourly.run, hourly.missed) == ([], 2_192 * 24 + 12)


@pytest.mark.parametrize(
    ("expression", "zone", "after", "until"),
    [
        ("* * * * *", "UTC", utc(2026, 1, 1, 10, 0, 0, 1), utc(2026, 1, 9, 10, 30)),
        ("*/15 * * * *", "Europe/Paris", utc(2025, 12, 30, 7, 3), utc(2027, 1, 2, 11)),
        ("30 2 * * *", "Europe/Paris", utc(2026, 3, 1), utc(2026, 11, 1)),
        ("*/30 1-2 * * *", "America/New_York", utc(2026, 1, 1), utc(2026, 12, 31)),
        ("0 0 13 * fri", "America/Santiago", utc(2025, 1, 1), utc(2027, 1, 1)),  # DST at midnight
        ("0,30 * * * *", "Australia/Lord_Howe", utc(2026, 1, 1), utc(2027, 1, 1)),  # 30-minute DST
        ("0 */6 * * *", "Pacific/Apia", utc(2011, 12, 1), utc(2012, 1, 31)),  # 2011-12-30 skipped
    ],
)
def test_ticks_are_counted_as_they_are_walked(
    expression: str, zone: str, after: datetime, until: datetime
) -> None:
    cron, walked, tick = parse(expression), 0, after
    while (tick := cron.next_after(tick, ZoneInfo(zone))) <= until:
        walked += 1
    assert cron.count(after, until, ZoneInfo(zone)) == walked > 0


# --- settings and checks ------------------------------------------------------------


def check_ids(settings: Any, schedules: Any) -> list[tuple[str, str]]:
    settings.DJANGO_JOBS = {"SCHEDULES": schedules}
    return [(m.id, m.msg) for m in check_schedules()]


def test_valid_settings_schedules_pass(settings: Any) -> None:
    schedules = {
        "nightly": {"job_type": "tests.noop", "cron": "0 3 * * *"},
        "hourly": {
            "job_type": "tests.echo",
            "cron": "@hourly",
            "timezone": "America/New_York",
            "missed": "catch_up",
            "input": {"report": "sales"},
        },
    }
    assert check_ids(settings, schedules) == []
    found = {e.name: e for e in entries(all_handlers())}
    assert (found["hourly"].pool, found["hourly"].schedule.input) == ("echo", {"report": "sales"})
    assert found["nightly"].job_type == "tests.noop"


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (
            {"job_type": "tests.noop", "cron": "0 3 * *"},
            "E010",
            "invalid cron expression '0 3 * *'",
        ),
        ({"job_type": "tests.noop"}, "E010", "must be a string, got None"),
        (
            {"job_type": "tests.noop", "cron": "@daily", "timezone": "Europe/Pariss"},
            "E011",
            "unknown time zone 'Europe/Pariss'",
        ),
        (
            {"job_type": "tests.nope", "cron": "@daily"},
            "E012",
            "no job is registered as 'tests.nope'",
        ),
        ({"job_type": "tests.noop", "cron": "@daily", "missed": "all"}, "E009", "got 'all'"),
        ({"job_type": "tests.noop", "cron": "@daily", "pool": "x"}, "E009", "unknown key 'pool'"),
        (
            {"job_type": "tests.noop", "cron": "@daily", "input": {"x": 1j}},
            "E009",
            "not JSON-serializable",
        ),
        ({"job_type": "tests.noop", "cron": "0 0 30 2 *"}, "E010", "it never fires"),
        ({"cron": "@daily"}, "E009", "'job_type' must be a job type, got None"),
        ("0 3 * * *", "E009", "must be a dict, not str"),
    ],
)
def test_bad_settings_schedules_are_check_errors(
    settings: Any, spec: Any, code: str, message: str
) -> None:
    found = check_ids(settings, {"bad": spec})
    assert [c for c, _ in found] == [f"django_jobs.{code}"]
    assert "DJANGO_JOBS['SCHEDULES']['bad']" in found[0][1]
    assert message in found[0][1]
    assert entries(all_handlers()) == []  # left out, not scheduled


def test_settings_schedule_may_not_take_a_job_schedule_name(
    settings: Any, registered: list[str]
) -> None:
    registered.append("unit.taken")

    @job("unit.taken", schedule="@daily")
    def taken(ctx: object) -> None:
        return None

    found = check_ids(settings, {"unit.taken": {"job_type": "tests.noop", "cron": "@hourly"}})
    assert [c for c, _ in found] == ["django_jobs.E013"]
    assert "taken by the schedule of @job('unit.taken')" in found[0][1]
    assert [e.job_type for e in entries(all_handlers())] == ["unit.taken"]


def test_schedules_that_are_not_a_dict_are_e001(settings: Any) -> None:
    from django_jobs.checks import check_settings

    settings.DJANGO_JOBS = {"SCHEDULES": ["nightly"]}
    assert [m.id for m in check_settings()] == ["django_jobs.E001"]
    assert check_schedules() == []
