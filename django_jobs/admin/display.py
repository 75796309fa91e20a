"""HTML fragments the admin pages show: status badges, JSON, durations, links."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext

from ..models import JobRun, Status
from ..payloads import Unreadable, cut, finite

EMPTY = "-"  # what the admin shows for "no value", as Django's own columns do

STATUS_COLOURS: dict[str, str] = {
    Status.PENDING: "#6c757d",
    Status.RUNNING: "#0d6efd",
    Status.WAITING: "#6f42c1",
    Status.COMPLETED: "#198754",
    Status.FAILED: "#dc3545",
    Status.TIMED_OUT: "#fd7e14",
    Status.CANCELED: "#495057",
}


def badge(status: str) -> SafeString:
    label = Status(status).label if status in Status.values else status
    return format_html(
        '<span class="dj-status dj-status-{}" style="background:{};color:#fff;'
        'padding:2px 8px;border-radius:10px;white-space:nowrap">{}</span>',
        status,
        STATUS_COLOURS.get(status, "#6c757d"),
        label,
    )


# How many characters of one payload (an input, an output, an error, a
# traceback) a page renders. The whole value is a download away: an indented
# 1 MB input could otherwise render as hundreds of megabytes.
SHOWN = 64 * 1024


def pretty_json(value: Any, *, whole: str | None = None) -> SafeString:
    """JSON indented in a <pre>, escaped (format_html escapes every argument),
    at most ``SHOWN`` characters of it; past that, a note and the ``whole`` link."""
    if isinstance(value, Unreadable):
        return unreadable(value, whole=whole)
    text, was_cut = _indented(value)
    note = truncated(stored_size(value), whole) if was_cut else ""
    return format_html(
        '<pre class="dj-json" style="white-space:pre-wrap;margin:0">{}</pre>{}', text, note
    )


def _indented(value: Any) -> tuple[str, bool]:
    """The first ``SHOWN`` characters of ``value`` as indented JSON, and whether
    there was more. The encoder is iterated, so only what is shown is built."""
    encoder = DjangoJSONEncoder(indent=2, ensure_ascii=False, sort_keys=True)
    parts: list[str] = []
    length = 0
    for chunk in encoder.iterencode(value):
        parts.append(chunk)
        length += len(chunk)
        if length > SHOWN:
            return "".join(parts)[:SHOWN], True
    return "".join(parts), False


def stored_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON: about what the database holds."""
    text = json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)
    return len(text.encode("utf-8", "backslashreplace"))


def preformatted(
    text: str, *, whole: str | None = None, limit: int = SHOWN, size: int | None = None
) -> SafeString:
    """Text in a <pre>, at most ``limit`` characters; past that, a note and the ``whole`` link.

    ``size`` is the whole text's length in characters when ``text`` is already
    a cut of it (cut in the database); the note then counts characters, not bytes.
    """
    note = ""
    if size is not None and size > limit:
        note = truncated(size, whole, unit="characters")
    elif size is None and len(text) > limit:
        note = truncated(len(text.encode("utf-8", "backslashreplace")), whole)
    return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>{}', text[:limit], note)


def truncated(size: int, whole: str | None, *, unit: str = "bytes") -> SafeString:
    """The note under a cut value: its whole size (``unit``: bytes or characters),
    and where to get all of it."""
    if unit == "bytes":
        text = ngettext("truncated, {size} byte", "truncated, {size} bytes", size)
    else:
        text = ngettext("truncated, {size} character", "truncated, {size} characters", size)
    note = format_html(text, size=number(size))
    if whole is not None:
        note = format_html(
            gettext('{note}: <a href="{url}">download the whole value</a>'), note=note, url=whole
        )
    return format_html('<p class="dj-truncated">{}</p>', note)


def unreadable(value: Unreadable, *, whole: str | None = None) -> SafeString:
    """The mark in place of a stored value that cannot be read, and where to get it whole."""
    note = format_html(
        '<em class="dj-unreadable">{}</em>',
        gettext("unreadable: {problem}").format(problem=value.problem),
    )
    if whole is not None:
        note = format_html(
            gettext('{note}: <a href="{url}">download the whole value</a>'), note=note, url=whole
        )
    return note


# Characters of a cancel reason shown: the API stores at most 1,000, a row may hold more.
REASON_SHOWN = 1000

# Items of a list column (tags, the workers of each attempt) a page names, and
# how many characters of each: the rest are counted, "… and 12 more".
LISTED = 50
LISTED_ITEM = 100


def listed(value: Any, item: Any = None) -> str:
    """The items of a stored list, comma-separated: at most ``LISTED``, each cut
    to ``LISTED_ITEM`` characters; ``item(n, text)`` writes the n-th (from 1).
    A value that is not a list shows as one item; an unreadable one, marked."""
    if isinstance(value, Unreadable):
        return gettext("unreadable: {problem}").format(problem=value.problem)
    if value is None or value == []:
        return EMPTY
    items = value if isinstance(value, list) else [value]
    texts = []
    for n, one in enumerate(items[:LISTED], 1):
        text = cut(one if isinstance(one, str) else _compact(one), LISTED_ITEM)
        texts.append(item(n, text) if item is not None else text)
    shown = ", ".join(texts)
    if len(items) > LISTED:
        more = len(items) - LISTED
        shown += " " + ngettext("… and {count} more", "… and {count} more", more).format(
            count=number(more)
        )
    return shown


def _compact(value: Any) -> str:
    """A JSON value as short text; only its first characters are ever shown."""
    encoder = DjangoJSONEncoder(ensure_ascii=False)
    text = ""
    for chunk in encoder.iterencode(value):
        text += chunk
        if len(text) > LISTED_ITEM:
            break
    return text


def number(value: float, decimals: int | None = None) -> str:
    """``value`` as the user's language writes it: ``19,951`` in English, ``19 951`` in French."""
    return formats.number_format(value, decimals, force_grouping=True)


def timestamp(value: datetime | None) -> SafeString | str:
    """``2026-12-02 13:06:01`` in the current time zone: seconds matter to an
    operator lining runs up with logs; the full ISO form is the tooltip."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return format_html(
        '<time datetime="{}" title="{}" style="white-space:nowrap">{}</time>',
        local.isoformat(),
        local.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S"),
    )


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None or end < start:
        return EMPTY
    return elapsed((end - start).total_seconds())


def elapsed(seconds: float) -> str:
    """``350 ms``, ``4.2 s``, ``12.5 min``, ``3.0 h`` or ``2.5 days``, in the user's language."""
    if seconds < 1:
        return gettext("{value} ms").format(value=number(round(seconds * 1000)))
    if seconds < 120:
        return gettext("{value} s").format(value=number(seconds, 1))
    if seconds < 120 * 60:
        return gettext("{value} min").format(value=number(seconds / 60, 1))
    if seconds < 48 * 3600:
        return gettext("{value} h").format(value=number(seconds / 3600, 1))
    return gettext("{value} days").format(value=number(seconds / 86400, 1))


def so_far(duration: str) -> str:
    """A running run's duration until now."""
    return gettext("{duration} so far").format(duration=duration)


def run_link(run_id: int | None, text: str | None = None) -> SafeString | str:
    if run_id is None:
        return EMPTY
    url = reverse("admin:django_jobs_jobrun_change", args=[run_id])
    return format_html('<a href="{}">{}</a>', url, text or f"#{run_id}")


def run_label(run: JobRun) -> SafeString | str:
    return format_html("{} {} {}", run_link(run.pk), run.job_type, badge(run.status))


def progress(value: Any) -> str:
    """``3 / 12 (25%) copying rows``, from a run's ``progress``; the empty mark when
    none, a mark when it cannot be read."""
    if isinstance(value, Unreadable):
        return gettext("unreadable: {problem}").format(problem=value.problem)
    if not isinstance(value, dict):
        return EMPTY
    done, total = finite(value.get("done")), finite(value.get("total"))
    if done is None:
        return EMPTY
    text = f"{done:g}" if total is None else f"{done:g} / {total:g}"
    if total and total > 0:
        text += f" ({max(0.0, min(100.0, 100.0 * done / total)):.0f}%)"
    message = value.get("message") or ""
    message = message[:1000] if isinstance(message, str) else ""
    return f"{text} {message}" if message else text


# The most characters of one option's value shown (a RetryPolicy's repr is long).
OPTION_SHOWN = 200


def job_options(job_type: Any) -> SafeString | str:
    """The options ``DJANGO_JOBS["JOB_OPTIONS"]`` sets for ``job_type`` now, each with
    the key it comes from; they apply to the runs started (and attempts made) now."""
    from ..joboptions import in_force

    found = in_force(job_type) if isinstance(job_type, str) else []
    if not found:
        return EMPTY
    items = format_html_join(
        "",
        "<li>{} = {} <small>(JOB_OPTIONS[{}])</small></li>",
        (
            (name, cut(value, OPTION_SHOWN), cut(repr(key), OPTION_SHOWN))
            for name, value, key in found
        ),
    )
    return format_html('<ul style="margin:0;padding-left:1em">{}</ul>', items)
