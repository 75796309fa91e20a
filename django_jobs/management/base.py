"""What every django_jobs command shares: one-line argument errors, one-line database errors."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, OperationalError, ProgrammingError, connections

from django_jobs import conf


class OneLineParser(CommandParser):
    """A parser whose errors are one line (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
        raise CommandError(f"Error: {message}")


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` and its subcommands' parsers ``OneLineParser``s."""
    parser.__class__ = OneLineParser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                one_line_errors(subparser)


def where(alias: str) -> str:
    """The jobs database as a person recognises it: alias, host, port and name."""
    settings = connections[alias].settings_dict
    host = settings.get("HOST") or "localhost"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"{alias!r} ({host}{port}/{settings.get('NAME')})"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def missing_tables(exc: DatabaseError) -> bool:
    """Whether ``exc`` says a django_jobs table does not exist (not migrated)."""
    return isinstance(exc, ProgrammingError) and "django_jobs_" in str(exc)


def database_error(exc: DatabaseError, *, waited: float | None = None) -> CommandError:
    """One or two lines for a database the command cannot use, with what to do."""
    alias = conf.get().DATABASE
    if missing_tables(exc):
        return CommandError(
            f"The django_jobs tables are missing in database {where(alias)}: "
            f"{first_line(exc)}.\nRun `manage.py migrate django_jobs` first."
        )
    if isinstance(exc, OperationalError):
        after = "" if waited is None else f" (retried for {waited:g}s)"
        return CommandError(
            f"Cannot use the jobs database {where(alias)}{after}: {first_line(exc)}\n"
            "Check that the server runs and DATABASES / DJANGO_JOBS['DATABASE'] point to it."
        )
    return CommandError(f"Database error on {where(alias)}: {first_line(exc)}")


class JobsCommand(BaseCommand):
    """The base of django_jobs' commands: argument and database errors in a line or two."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        one_line_errors(parser)
        return parser

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            # A traceback of the driver's internals says less than these lines.
            raise database_error(exc) from exc
