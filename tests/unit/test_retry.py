from __future__ import annotations

import dataclasses
import logging
import math
import pickle
import random
from datetime import timedelta
from typing import Any

import pytest

from django_jobs import RetryAfter, RetryPolicy
from django_jobs.backoff import MAX_DELAY, NO_RETRY, backoff_delay, checked_delay
from django_jobs.exceptions import JobsError
from django_jobs.registry import JobHandler


class Declined(Exception):
    code = "card_declined"


class SubDeclined(Declined):
    pass


def test_exponential_doubles_from_base() -> None:
    delays = [
        backoff_delay(n, backoff="exponential", base=2.0, cap=None, jitter=False)
        for n in (1, 2, 3, 4)
    ]
    assert delays == [2.0, 4.0, 8.0, 16.0]


def test_fixed_stays_at_base() -> None:
    assert {
        backoff_delay(n, backoff="fixed", base=5, cap=None, jitter=False) for n in range(1, 6)
    } == {5}


def test_cap_limits_delay() -> None:
    assert backoff_delay(10, backoff="exponential", base=2.0, cap=300.0, jitter=False) == 300.0


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert backoff_delay(10_000, backoff="exponential", base=1.0, cap=60.0, jitter=False) == 60.0


def test_full_jitter_draws_between_zero_and_delay() -> None:
    rand = random.Random(7)
    draws = [
        backoff_delay(3, backoff="exponential", base=1.0, cap=None, jitter=True, rand=rand)
        for _ in range(200)
    ]
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert min(draws) < 1.0 < 3.0 < max(draws)


def test_policy_delay_uses_its_settings() -> None:
    policy = RetryPolicy(attempts=5, base_delay=timedelta(seconds=2), max_delay=5, jitter=False)
    assert [policy.delay(n) for n in (1, 2, 3)] == [2.0, 4.0, 5.0]


def test_attempts_count_every_attempt() -> None:
    policy = RetryPolicy(attempts=3, base_delay=0)
    error = RuntimeError("boom")
    assert policy.should_retry(error, 1)
    assert policy.should_retry(error, 2)
    assert not policy.should_retry(error, 3)


def test_default_policy_never_retries() -> None:
    assert not NO_RETRY.should_retry(RuntimeError(), 1)


@pytest.mark.parametrize(
    "entry",
    [Declined, "Declined", f"{__name__}.Declined", "card_declined"],
)
def test_non_retryable_matches_class_name_path_or_code(entry: object) -> None:
    policy = RetryPolicy(attempts=5, non_retryable=[entry])  # type: ignore[list-item]
    assert not policy.should_retry(Declined(), 1)
    assert policy.should_retry(RuntimeError(), 1)


def test_non_retryable_class_matches_subclasses() -> None:
    policy = RetryPolicy(attempts=5, non_retryable=[Declined])
    assert not policy.is_retryable(SubDeclined())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"attempts": 0}, ValueError),
        ({"attempts": "3"}, TypeError),
        ({"backoff": "linear"}, ValueError),
        ({"backoff": 30}, ValueError),
        ({"base_delay": -1}, ValueError),
        ({"max_delay": "soon"}, TypeError),
        ({"non_retryable": [42]}, TypeError),
    ],
)
def test_bad_policy_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_no_backoff_waits_longer_than_a_week() -> None:
    # Without max_delay, attempt 60 would be 2**59 s: past what a date can hold.
    assert RetryPolicy(attempts=100, jitter=False).delay(60) == MAX_DELAY == 7 * 86_400
    assert RetryPolicy(backoff="fixed", base_delay=10**7, jitter=False).delay(1) == MAX_DELAY


# --- RetryAfter ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(0, 0.0), (30, 30.0), (2.5, 2.5), (timedelta(minutes=2), 120.0), (MAX_DELAY, MAX_DELAY)],
)
def test_retry_after_takes_seconds_or_a_timedelta(delay: Any, seconds: float) -> None:
    assert RetryAfter(delay).seconds == seconds


@pytest.mark.parametrize(
    ("delay", "error", "message"),
    [
        (-1, ValueError, "must be from 0 to 604800 seconds (a week), got -1"),
        (math.nan, ValueError, "got nan"),
        (math.inf, ValueError, "got inf"),
        (MAX_DELAY + 1, ValueError, "got 604801.0"),
        (timedelta(days=8), ValueError, "got datetime.timedelta(days=8)"),
        (10**400, ValueError, "got 1000000"),  # too large for a float; shortened
        ("30", TypeError, "must be seconds or a timedelta, got '30'"),
        (True, TypeError, "got True"),
        (None, TypeError, "got None"),
    ],
)
def test_retry_after_refuses_what_is_no_delay(
    delay: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=r"^RetryAfter's delay ") as raised:
        RetryAfter(delay)
    assert message in str(raised.value)
    assert len(str(raised.value)) < 200


def test_retry_after_says_when_and_why_and_survives_pickling() -> None:
    asked = RetryAfter(timedelta(seconds=90), "429 from the API")
    assert isinstance(asked, JobsError)
    assert str(asked) == "retry in 90s: 429 from the API"
    assert str(RetryAfter(1.5)) == "retry in 1.5s"
    copy = pickle.loads(pickle.dumps(asked))
    assert (type(copy), copy.seconds, copy.reason, str(copy)) == (
        RetryAfter,
        90.0,
        "429 from the API",
        str(asked),
    )


def test_retry_after_is_retryable_whatever_non_retryable_lists() -> None:
    policy = RetryPolicy(attempts=3, non_retryable=[JobsError, "RetryAfter"])
    handler = JobHandler("tests.unit", lambda ctx: None, retry=policy)
    assert handler.retryable(RetryAfter(5))
    assert not handler.retryable(JobsError())


def test_checked_delay_names_what_it_checks() -> None:
    with pytest.raises(ValueError, match=r"^the wait must be from 0 to 604800 seconds"):
        checked_delay(-0.5, "the wait")


# --- backoff functions ------------------------------------------------------------------


def test_a_backoff_function_is_given_the_attempt_and_its_delay_used() -> None:
    seen: list[int] = []

    def linear(attempt: int) -> float:
        seen.append(attempt)
        return 10.0 * attempt

    policy = RetryPolicy(attempts=5, backoff=linear, jitter=False)
    assert [policy.delay(n) for n in (1, 2, 3)] == [10.0, 20.0, 30.0]
    assert seen == [1, 2, 3]


def test_a_backoff_function_may_return_a_timedelta_and_max_delay_caps_it() -> None:
    policy = RetryPolicy(
        backoff=lambda attempt: timedelta(minutes=attempt), max_delay=150, jitter=False
    )
    assert [policy.delay(n) for n in (1, 2, 3)] == [60.0, 120.0, 150.0]


def test_a_backoff_functions_long_waits_end_at_a_week() -> None:
    policy = RetryPolicy(backoff=lambda attempt: 60.0 * 2**attempt, jitter=False)
    assert policy.delay(40) == MAX_DELAY
    assert RetryPolicy(backoff=lambda attempt: 10**400, jitter=False).delay(1) == MAX_DELAY


def test_jitter_draws_below_a_backoff_functions_delay() -> None:
    policy = RetryPolicy(backoff=lambda attempt: 100, jitter=True)
    rand = random.Random(3)
    draws = [policy.delay(1, rand) for _ in range(200)]
    assert all(0.0 <= d <= 100.0 for d in draws)
    assert min(draws) < 20.0 < 80.0 < max(draws)


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("soon", "must be seconds or a timedelta, got 'soon'"),
        (None, "must be seconds or a timedelta, got None"),
        (-3, "must be from 0 to 604800 seconds (a week), got -3"),
        (math.nan, "must be from 0 to 604800 seconds (a week), got nan"),
    ],
)
def test_a_bad_value_is_logged_and_the_exponential_backoff_used(
    returned: Any, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    def backoff(attempt: int) -> Any:
        return returned

    policy = RetryPolicy(backoff=backoff, base_delay=4, max_delay=10, jitter=False)
    with caplog.at_level(logging.ERROR, logger="django_jobs.backoff"):
        assert [policy.delay(n) for n in (1, 2, 3)] == [4.0, 8.0, 10.0]
    assert len(caplog.records) == 3
    message = caplog.records[0].getMessage()
    assert f"RetryPolicy backoff {__name__}." in message
    assert ".backoff(1) " + said in message
    assert message.endswith("; using the exponential backoff")


def test_a_backoff_function_that_raises_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(attempt: int) -> float:
        raise KeyError("no table for this attempt")

    policy = RetryPolicy(backoff=broken, base_delay=2, jitter=False)
    with caplog.at_level(logging.ERROR, logger="django_jobs.backoff"):
        assert policy.delay(3) == 8.0
    (record,) = caplog.records
    assert "broken(3) raised; using the exponential backoff" in record.getMessage()
    assert record.exc_info is not None
    assert record.exc_info[0] is KeyError


def linear_minutes(attempt: int) -> float:
    return 60.0 * attempt


def test_a_policy_with_a_function_stays_frozen_hashable_and_readable() -> None:
    policy = RetryPolicy(attempts=4, backoff=linear_minutes, max_delay=600)
    assert policy == RetryPolicy(attempts=4, backoff=linear_minutes, max_delay=600)
    assert hash(policy) == hash(RetryPolicy(attempts=4, backoff=linear_minutes, max_delay=600))
    assert policy != RetryPolicy(attempts=4, backoff=lambda attempt: 60.0 * attempt)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.backoff = "fixed"  # type: ignore[misc]
    assert repr(policy) == (
        f"RetryPolicy(attempts=4, backoff=<function {__name__}.linear_minutes>, "
        "base_delay=1.0, max_delay=600.0, jitter=True, non_retryable=())"
    )
    assert repr(RetryPolicy()).startswith("RetryPolicy(attempts=3, backoff='exponential', ")
