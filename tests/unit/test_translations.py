"""The admin's catalogs cover every string marked for translation, and say the same thing.

What ``makemessages`` would extract is found here without gettext's tools: the
calls to gettext's functions in the admin, the models and the app config (read
with ``ast``), and Django's own reading of the templates (``templatize``). Every
catalog under ``django_jobs/locale`` must translate all of them, and its
compiled ``.mo`` must hold what its ``.po`` says.
"""

from __future__ import annotations

import ast
import gettext
import re
from pathlib import Path

import pytest
from django.utils.translation.template import templatize

import django_jobs

PACKAGE = Path(django_jobs.__file__).parent
SOURCES = sorted(
    [
        *(PACKAGE / "admin").glob("*.py"),
        PACKAGE / "models.py",
        PACKAGE / "states.py",
        PACKAGE / "apps.py",
    ]
)
TEMPLATES = sorted((PACKAGE / "templates").rglob("*.html"))
LOCALES = sorted(path.parent for path in PACKAGE.glob("locale/*/LC_MESSAGES/django.po"))

# gettext's functions by name, and which of their arguments are msgids.
SINGULAR = {"_", "gettext", "gettext_lazy", "pgettext", "pgettext_lazy"}
PLURAL = {"ngettext", "ngettext_lazy", "npgettext", "npgettext_lazy"}
CONTEXT = {"pgettext", "pgettext_lazy", "npgettext", "npgettext_lazy"}

# A msgid: its text, or (singular, plural), with a context ahead when it has one.
Msgid = str | tuple[str, str]


def _name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "translation"
    ):
        return func.attr
    return None


def python_msgids(path: Path) -> set[Msgid]:
    """The msgids of ``path``; a call whose msgid is not a plain string literal fails."""
    found: set[Msgid] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or _name(node) not in SINGULAR | PLURAL:
            continue
        name = _name(node)
        args = node.args[1:] if name in CONTEXT else node.args
        count = 2 if name in PLURAL else 1
        texts = args[:count]
        where = f"{path.name}:{node.lineno}"
        assert len(texts) == count, f"{where}: {name}() without its msgid"
        for text in texts:
            # An f-string or a concatenation would put values in the msgid: use
            # named placeholders, formatted after translation.
            literal = isinstance(text, ast.Constant) and isinstance(text.value, str)
            assert literal, f"{where}: the msgid of {name}() must be a string literal"
        values = tuple(t.value for t in texts if isinstance(t, ast.Constant))
        msgid: Msgid = values[0] if count == 1 else (values[0], values[1])
        found.add(msgid)
    return found


# A Python string literal as templatize writes one (repr, with a u prefix).
_LITERAL = r"""u?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
_TEMPLATE_CALL = re.compile(
    rf"(?<![\w.])(?P<name>gettext|ngettext|pgettext|npgettext|_)"
    rf"\((?P<args>{_LITERAL}(?:, {_LITERAL})*)"
)


def template_msgids(path: Path) -> set[Msgid]:
    """The msgids of a template, as makemessages reads them (Django's ``templatize``)."""
    found: set[Msgid] = set()
    for match in _TEMPLATE_CALL.finditer(templatize(path.read_text(), origin=str(path))):
        texts = [ast.literal_eval(text) for text in re.findall(_LITERAL, match["args"])]
        name = match["name"]
        if name in CONTEXT:
            texts = texts[1:]
        found.add((texts[0], texts[1]) if name in PLURAL else texts[0])
    return found


def source_msgids() -> set[Msgid]:
    found: set[Msgid] = set()
    for path in SOURCES:
        found |= python_msgids(path)
    for path in TEMPLATES:
        found |= template_msgids(path)
    return found


def po_entries(path: Path) -> dict[Msgid, list[str]]:
    """The entries of a .po file: msgid (or its singular and plural) -> msgstr(s).

    Enough of the format for the catalogs ``makemessages`` writes: comments,
    flags, msgid, msgid_plural, msgstr and msgstr[n], strings over several lines.
    """
    entries: dict[Msgid, list[str]] = {}
    fields: dict[str, str] = {}
    current = ""
    fuzzy = False

    def flush() -> None:
        nonlocal fuzzy
        if fields.get("msgid"):
            assert not fuzzy, f"{path}: {fields['msgid']!r} is fuzzy"
            msgid: Msgid = (
                (fields["msgid"], fields["msgid_plural"])
                if "msgid_plural" in fields
                else fields["msgid"]
            )
            strings = [fields[key] for key in sorted(fields) if key.startswith("msgstr")]
            entries[msgid] = strings
        fields.clear()
        fuzzy = False

    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if not line.strip():
            flush()
        elif line.startswith("#,"):
            fuzzy = fuzzy or "fuzzy" in line
        elif line.startswith("#~"):
            raise AssertionError(f"{path}: obsolete entries are left in it: {line}")
        elif line.startswith("#"):
            continue
        elif line.startswith('"'):
            fields[current] += ast.literal_eval(line)
        else:
            key, _, text = line.partition(" ")
            if key == "msgid" and "msgid" in fields:
                flush()
            current = key
            fields[current] = ast.literal_eval(text)
    return entries


def placeholders(text: str) -> set[str]:
    return set(re.findall(r"\{\w*\}|%\(\w+\)[sd]", text))


@pytest.fixture(params=LOCALES, ids=lambda path: path.parent.name)
def locale(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


def test_there_is_a_catalog() -> None:
    assert [path.parent.name for path in LOCALES] == ["fr"]


def test_the_sources_mark_what_the_admin_shows() -> None:
    found = source_msgids()
    # A few from each place, so that an extraction finding nothing fails here.
    assert {"Retry", "Summary", "job runs", "Pending", "Jobs", "Pools", "Home"} <= found
    assert ("%(verb)s %(total)s run:", "%(verb)s %(total)s runs:") in found
    assert (
        "{verb}: {changed} run changed, {skipped} skipped.",
        "{verb}: {changed} runs changed, {skipped} skipped.",
    ) in found


def test_the_catalog_translates_every_msgid_of_the_sources_and_no_other(locale: Path) -> None:
    entries = po_entries(locale / "django.po")
    assert set(entries) == source_msgids(), "run makemessages (docs/contributing.md)"
    untranslated = [msgid for msgid, strings in entries.items() if not all(strings)]
    assert untranslated == []


def test_translations_keep_the_placeholders(locale: Path) -> None:
    for msgid, strings in po_entries(locale / "django.po").items():
        # A plural's singular form may leave its count out ("the last minute").
        singular, plural = (msgid, msgid) if isinstance(msgid, str) else msgid
        for text in strings:
            assert placeholders(singular) <= placeholders(text) <= placeholders(plural), (
                msgid,
                text,
            )


def test_the_compiled_catalog_is_the_po_file(locale: Path) -> None:
    with (locale / "django.mo").open("rb") as file:
        compiled = gettext.GNUTranslations(file)
    for msgid, strings in po_entries(locale / "django.po").items():
        if isinstance(msgid, str):
            assert compiled.gettext(msgid) == strings[0], "run compilemessages"
        else:
            assert [compiled.ngettext(*msgid, n) for n in (1, 2)] == strings, msgid


def test_an_interpolated_msgid_is_caught(tmp_path: Path) -> None:
    # The rule is not vacuous: values formatted into a msgid before translation fail.
    source = tmp_path / "bad.py"
    source.write_text('from django.utils.translation import gettext\ngettext(f"run {x}")\n')
    with pytest.raises(AssertionError, match="string literal"):
        python_msgids(source)
