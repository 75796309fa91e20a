"""Rates and the sliding window's maths (no database)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from django_jobs import job
from django_jobs.checks import check_rate_limits
from django_jobs.ratelimits import MAX_COUNT, Limits, Rate, Window, in_force, parse_rate


@pytest.mark.parametrize(
    ("text", "count", "seconds"),
    [
        ("100/m", 100, 60.0),
        ("5/s", 5, 1.0),
        ("1000/h", 1000, 3600.0),
        ("50/d", 50, 86400.0),
        ("10/30s", 10, 30.0),
        (" 1 / 5m ", 1, 300.0),
        ("3/1.5s", 3, 1.5),
    ],
)
def test_rates_are_parsed(text: str, count: int, seconds: float) -> None:
    assert parse_rate(text) == Rate(count, seconds)


@pytest.mark.parametrize(
    "text", ["", "100", "100/", "/m", "100/w", "-1/m", "0/m", "1e3/m", "100/0s", "10/8d", "x/m"]
)
def test_bad_rates_are_refused_saying_what_a_rate_is(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


@pytest.mark.parametrize("value", [None, 100, 1.5, b"5/s", ["5/s"]])
def test_a_rate_is_a_string(value: object) -> None:
    with pytest.raises(TypeError, match="'100/m'"):
        parse_rate(value)


def test_a_rate_is_bounded() -> None:
    with pytest.raises(ValueError, match="count"):
        Rate(MAX_COUNT + 1, 1.0)
    with pytest.raises(ValueError, match="period"):
        Rate(1, math.nan)
    with pytest.raises(TypeError):
        Rate(True, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["100/m", "5/s", "1000/h", "50/d", "10/30s", "3/1.5s", "7/2h"])
def test_a_rate_reads_back_as_written(text: str) -> None:
    assert parse_rate(str(parse_rate(text))) == parse_rate(text)


def test_a_window_admits_count_then_opens_as_its_oldest_start_leaves() -> None:
    window = Window.read([[100.0, 2], [100.5, 1]], Rate(4, 10.0), now=105.0)
    assert window.has_room()
    window.admit()
    assert not window.has_room()
    # Full: room comes back when the two starts of 100.0 leave the window.
    assert window.opens_at() == 110.0
    assert window.stored() == [[100.0, 2], [100.5, 1], [105.0, 1]]


def test_starts_older_than_the_period_are_dropped() -> None:
    window = Window.read([[90.0, 5], [99.0, 1]], Rate(2, 10.0), now=105.0)
    assert window.count() == 1
    assert window.opens_at() is None


@pytest.mark.parametrize(
    "stored",
    [None, "x", [["a", 1]], [[1.0]], [[float("nan"), 1]], [[104.0, -3]], [[104.0, True]], {}],
)
def test_a_malformed_window_is_read_as_empty_rather_than_trusted(stored: object) -> None:
    window = Window.read(stored, Rate(1, 10.0), now=105.0)
    assert window.count() == 0


@given(
    st.lists(st.floats(min_value=0, max_value=0.999), min_size=1, max_size=200),
    st.integers(min_value=1, max_value=10),
)
@example(
    gaps=[0.62471624662127, 0.5, 0.5], count=1
)  # opened exactly at a claim: float sums must agree
def test_no_span_of_the_period_holds_more_than_count_admitted_starts(
    gaps: list[float], count: int
) -> None:
    """Claims at arbitrary instants, each admitting what the window allows: in every
    span of the period, at most ``count`` admitted starts."""
    rate = Rate(count, 1.0)
    stored: list[list[float]] = []
    admitted: list[float] = []
    now = 0.0
    for gap in gaps:
        now += gap
        window = Window.read(stored, rate, now)
        while window.has_room():
            window.admit()
            admitted.append(now)
        opens = window.opens_at()
        assert opens is not None
        assert opens > now
        stored = window.stored()
    for start in admitted:
        assert sum(1 for other in admitted if start <= other < start + rate.seconds) <= count


def test_the_limits_in_force_come_from_jobs_and_settings(settings: object) -> None:
    class Job:
        def __init__(self, job_type: str, pool: str, rate: str | None, keyed: bool) -> None:
            self.job_type, self.pool = job_type, pool
            self.rate_limit = None if rate is None else parse_rate(rate)
            self.keyed_rate = keyed

    handlers = {
        "a": Job("a", "p", "5/s", keyed=False),
        "b": Job("b", "q", "1/h", keyed=True),
        "c": Job("c", "p", None, keyed=False),
    }
    settings.DJANGO_JOBS = {"RATE_LIMITS": {"p": "100/m", "r": "nonsense"}}  # type: ignore[attr-defined]
    assert in_force(handlers) == Limits(
        {"a": Rate(5, 1.0), "b": Rate(1, 3600.0)}, frozenset({"b"}), {"p": Rate(100, 60.0)}
    )
    # A job's limit holds in every pool (a run may be started in another than its job's).
    assert in_force(handlers, ["q"]) == Limits(
        {"a": Rate(5, 1.0), "b": Rate(1, 3600.0)}, frozenset({"b"}), {}
    )
    assert in_force({}, ["elsewhere"]) == Limits()
    assert not in_force({}, ["p"]).jobs


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"rate_limit": "fast"}, ValueError, "count/unit"),
        ({"rate_limit": 100}, TypeError, "'100/m'"),
        ({"rate_limit_key": "k"}, TypeError, "needs a rate_limit"),
        ({"rate_limit": "1/s", "rate_limit_key": 5}, TypeError, "string or a callable"),
    ],
)
def test_job_refuses_a_bad_rate_limit_at_import(
    options: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        job("tests.never_registered", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"emails": "lots"}, "DJANGO_JOBS['RATE_LIMITS']['emails']: a rate limit is 'count/unit'"),
        ({"": "1/s"}, "DJANGO_JOBS['RATE_LIMITS']: '' is not a pool name"),
        (["1/s"], "DJANGO_JOBS['RATE_LIMITS'] must be a dict of rates by pool"),
    ],
)
def test_check_e014_reports_bad_pool_limits(settings: object, limits: object, message: str) -> None:
    settings.DJANGO_JOBS = {"RATE_LIMITS": limits}  # type: ignore[attr-defined]
    found = [m for m in check_rate_limits() if m.id == "django_jobs.E014"]
    assert len(found) == 1
    assert found[0].msg.startswith(message)
    assert "docs/rate-limits.md" in (found[0].hint or "")


def test_check_e014_is_quiet_for_good_limits(settings: object) -> None:
    settings.DJANGO_JOBS = {"RATE_LIMITS": {"emails": "100/m", "reports": "1/5m"}}  # type: ignore[attr-defined]
    assert check_rate_limits() == []
