from __future__ import annotations

import random
from datetime import timedelta

import pytest

from django_jobs import RetryPolicy
from django_jobs.backoff import NO_RETRY, backoff_delay


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
        ({"base_delay": -1}, ValueError),
        ({"max_delay": "soon"}, TypeError),
        ({"non_retryable": [42]}, TypeError),
    ],
)
def test_bad_policy_is_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
