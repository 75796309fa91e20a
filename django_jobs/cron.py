"""Cron expressions: parsing, and the ticks in a time zone. Pure: no database, no settings.

Five fields, ``minute hour day-of-month month day-of-week``, each a list of
``*``, ``N``, ``A-B``, ``*/S``, ``A-B/S`` or ``A/S`` (from A to the field's
end), with month names (``jan``) and day names (``mon``), 0 or 7 for Sunday,
and the macros ``@hourly``, ``@daily``/``@midnight``, ``@weekly``,
``@monthly``, ``@yearly``/``@annually``.

As in Vixie cron and cronie, when both day fields are restricted (neither
starts with ``*``) a day matching either fires; otherwise a day must match both.

Ticks are wall-clock times in a zone, stored as UTC instants:

* a wall time that does not exist (the spring-forward gap) fires at the end of
  the gap, the first instant after it; ticks landing on one instant fire once;
* a wall time that occurs twice (the fall-back hour) fires once, at its first
  occurrence.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
WEEKDAYS = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)
# The Gregorian calendar, weekdays included, repeats every 400 years.
CYCLE_YEARS = 400
# Ticks are whole seconds, so no tick falls between an instant and this before it.
JUST_BEFORE = timedelta(microseconds=1)
# Characters of an expression an error message repeats.
SHOWN = 100


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, MONTHS),
    _Field("day of week", 0, 7, WEEKDAYS),
)


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression; ``parse()`` makes one."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]  # 0 is Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def __str__(self) -> str:
        return self.expression

    def matches_day(self, day: date) -> bool:
        """Whether ``day`` (its month aside) matches the two day fields."""
        in_days = day.day in self.days
        in_weekdays = day.isoweekday() % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def next_wall(self, start: datetime) -> datetime | None:
        """Return the first matching naive wall time at or after ``start`` (whole minutes).

        Whole months, days and hours that cannot match are skipped at once.
        None when nothing matches within 400 years: the Gregorian calendar
        repeats every 400 years (weekdays included), so nothing ever will.
        """
        day, hour, minute = start.date(), start.hour, start.minute
        last_year = day.year + CYCLE_YEARS
        while day.year <= last_year:
            if day.month not in self.months:
                day = self._next_month(day)
                hour = minute = 0
            elif not self.matches_day(day) or (h := _first_at_least(self.hours, hour)) is None:
                day += DAY
                hour = minute = 0
            elif h != hour:
                hour, minute = h, 0
            elif (m := _first_at_least(self.minutes, minute)) is None:
                hour, minute = hour + 1, 0
                if hour == 24:
                    day, hour = day + DAY, 0
            else:
                return datetime.combine(day, time(hour, m))
        return None

    def _next_month(self, day: date) -> date:
        later = _first_at_least(self.months, day.month + 1)
        if later is None:
            return date(day.year + 1, self.months[0], 1)
        return date(day.year, later, 1)

    def next_after(self, instant: datetime, zone: tzinfo) -> datetime:
        """Return the first tick strictly after the aware ``instant``, in UTC.

        Fields match wall-clock time in ``zone``.
        """
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise ValueError(f"instant must be an aware datetime, got {instant!r}")
        wall = instant.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0) + MINUTE
        while True:
            found = self.next_wall(wall)
            if found is None:  # parse() refuses such an expression
                raise ValueError(f"cron {self.expression!r} never fires")
            tick = wall_to_instant(found, zone)
            # Not later than ``instant``: a wall time whose first occurrence
            # passed (in a repeated hour), or a gap's tick already fired.
            if tick > instant:
                return tick
            wall = found + MINUTE

    def count(self, after: datetime, until: datetime, zone: tzinfo) -> int:
        """Count the ticks in ``(after, until]`` (aware instants) without walking every one.

        A whole day with one UTC offset throughout has one tick per matching
        wall time; the first and last days, and days when the offset changes,
        are walked tick by tick.
        """
        day = after.astimezone(zone).date() + DAY
        last = until.astimezone(zone).date()
        if day > last:
            return self._walk(after, until, zone)
        start = wall_to_instant(datetime.combine(day, time()), zone)
        total = self._walk(after, start - JUST_BEFORE, zone)
        per_day = len(self.hours) * len(self.minutes)
        while day < last:
            end = wall_to_instant(datetime.combine(day + DAY, time()), zone)
            # 24 hours, with the offset just before it starts the one at its
            # end: no gap or repeated hour that day, nor a gap ending at its
            # midnight (no zone changes its offset twice in a day).
            if end - start == DAY and _offset(start - JUST_BEFORE, zone) == _offset(end, zone):
                total += per_day if day.month in self.months and self.matches_day(day) else 0
            else:
                total += self._walk(start - JUST_BEFORE, end - JUST_BEFORE, zone)
            day, start = day + DAY, end
        return total + self._walk(start - JUST_BEFORE, until, zone)

    def _walk(self, after: datetime, until: datetime, zone: tzinfo) -> int:
        found, tick = 0, self.next_after(after, zone)
        while tick <= until:
            found, tick = found + 1, self.next_after(tick, zone)
        return found


def wall_to_instant(wall: datetime, zone: tzinfo) -> datetime:
    """Return the UTC instant of naive ``wall`` in ``zone``: the first of two, the gap's end."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first  # exists; fold=0 is the earlier of two occurrences
    # In a gap: fold=1 reads the wall time with the offset after the change,
    # which gives an instant before it, and fold=0 one after it. The change
    # itself is the first instant (whole seconds) with the later offset.
    before = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    after, offset = first, first.astimezone(zone).utcoffset()
    while after - before > timedelta(seconds=1):
        middle = before + timedelta(seconds=(after - before) // timedelta(seconds=2))
        if middle.astimezone(zone).utcoffset() == offset:
            after = middle
        else:
            before = middle
    return after


def parse(expression: str) -> Cron:
    """Parse a cron expression or raise ``ValueError`` naming what is wrong."""
    if not isinstance(expression, str):
        raise TypeError(f"a cron expression must be a string, got {expression!r}")
    text = expression.strip()
    if text.startswith("@"):
        macro = MACROS.get(text.lower())
        if macro is None:
            raise _error(expression, f"unknown macro {text!r}; use one of {', '.join(MACROS)}")
        text = macro
    parts = text.split()
    if len(parts) != 5:
        raise _error(
            expression,
            f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}",
        )
    values = [
        _parse_field(expression, part, spec) for part, spec in zip(parts, FIELDS, strict=True)
    ]
    weekdays = frozenset(day % 7 for day in values[4])
    cron = Cron(
        expression=expression,
        minutes=tuple(sorted(values[0])),
        hours=tuple(sorted(values[1])),
        days=frozenset(values[2]),
        months=tuple(sorted(values[3])),
        weekdays=weekdays,
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )
    _check_possible(cron)
    return cron


def _parse_field(expression: str, text: str, spec: _Field) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            step = _number(expression, step_text, spec, what="step")
            if step < 1:
                raise _error(expression, f"{spec.name} step must be at least 1, got {item!r}")
        if base == "*":
            low, high = spec.low, spec.high
        elif "-" in base:
            first, _, last = base.partition("-")
            low, high = _value(expression, first, spec), _value(expression, last, spec)
            if spec.names is WEEKDAYS and high == 0 < low:
                high = 7  # "fri-sun": Sunday ends the week too
            if low > high:
                raise _error(expression, f"{spec.name} range {base!r} runs backwards")
        else:
            low = _value(expression, base, spec)
            high = spec.high if slash else low
        values.update(range(low, high + 1, step))
    return values


def _value(expression: str, text: str, spec: _Field) -> int:
    if spec.names is not None and text.lower() in spec.names:
        return spec.names[text.lower()]
    number = _number(expression, text, spec, what="value")
    if not spec.low <= number <= spec.high:
        raise _error(
            expression,
            f"{spec.name} {number} is out of range ({spec.low}-{spec.high})",
        )
    return number


def _number(expression: str, text: str, spec: _Field, *, what: str) -> int:
    if not text.isascii() or not text.isdigit():
        names = f" or a name ({', '.join(spec.names)})" if spec.names and what == "value" else ""
        raise _error(expression, f"{spec.name} {what} {text!r} is not a number{names}")
    return int(text)


def _check_possible(cron: Cron) -> None:
    """Refuse an expression no day of the 400-year calendar cycle matches ("0 0 30 2 *")."""
    if cron.next_wall(datetime(2000, 1, 1)) is None:
        raise _error(cron.expression, "no date matches its day and month fields: it never fires")


def _first_at_least(values: tuple[int, ...], minimum: int) -> int | None:
    index = bisect.bisect_left(values, minimum)
    return values[index] if index < len(values) else None


def _error(expression: str, detail: str) -> ValueError:
    # Cut: the text may come from a row or a form, of any length, and the
    # message goes to a log line or a page.
    shown = expression if len(expression) <= SHOWN else expression[:SHOWN] + "…"
    return ValueError(f"invalid cron expression {shown!r}: {detail[: 2 * SHOWN]}")


def _offset(instant: datetime, zone: tzinfo) -> timedelta | None:
    return instant.astimezone(zone).utcoffset()
