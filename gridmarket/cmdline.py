"""What the two command lines share (the provider's ``gridmarket-agent``, ``agent/cli.py``, and
the submitter's ``gridmarket``, ``frontend_api/submitter_cli.py``): a typer app built the same
way, failures as one line on stderr with exit status 1 (never a traceback), the root options
and the keystore password prompt.

typer is imported by the functions that need it, not by this module: the agent's daemon
(``gridmarket-agent run``, :mod:`agent.cli`) reports its failures with :func:`run_friendly`
and does not load typer, click or rich (docs/agent.md, "Footprint").
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, ParamSpec, TypeVar

if TYPE_CHECKING:
    import typer

__all__ = [
    "command_app",
    "fail",
    "failure_line",
    "friendly",
    "one_line",
    "prompt_password",
    "root_options",
    "run_friendly",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def command_app(name: str, help: str) -> typer.Typer:
    """A typer app: help when called bare, no shell-completion commands, plain errors."""
    import typer

    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


def one_line(exc: BaseException) -> str:
    """An error's message on one line (its type's name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    import typer

    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def friendly(
    expected: Callable[[], tuple[type[BaseException], ...]], log: logging.Logger
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a command so any failure is one line on stderr and exit status 1 (130 on ^C).

    ``expected()`` names the errors whose message says it all (the command's own, the
    keystore's, ...); a function, so their modules load only when a command fails. Any other
    error is shown with its type's name. The traceback goes to ``log`` at debug level.
    """

    import typer

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, typer.Abort, SystemExit):
                raise
            except KeyboardInterrupt:
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None
            except Exception as exc:
                log.debug("command failed", exc_info=True)
                fail(failure_line(exc, expected()))

        return wrapper

    return decorate


def failure_line(exc: BaseException, expected: tuple[type[BaseException], ...]) -> str:
    """What a command prints after ``error:`` for ``exc``: its message when it is one of the
    ``expected`` errors (their message says it all), else prefixed by its type's name."""
    if isinstance(exc, expected):
        return one_line(exc)
    return f"{type(exc).__name__}: {one_line(exc)}"


def run_friendly(
    fn: Callable[[], int],
    expected: Callable[[], tuple[type[BaseException], ...]],
    log: logging.Logger,
) -> int:
    """:func:`friendly` for a command line without typer: ``fn()``'s exit status, or 1 after
    ``error: ...`` on stderr when it fails (130 after ``interrupted`` on ^C)."""
    try:
        return fn()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        log.debug("command failed", exc_info=True)
        print(f"error: {failure_line(exc, expected())}", file=sys.stderr)
        return 1


def root_options(ctx: typer.Context, kind: type[T]) -> T | None:
    """The options the app's callback stored on the root context, if it ran."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, kind) else None


def prompt_password(*, confirm: bool = False) -> str | None:
    """Ask for the keystore password on the terminal; None when stdin is not a terminal (the
    caller then says where the password should come from)."""
    if not sys.stdin.isatty():
        return None
    import typer

    value: str = typer.prompt("Keystore password", hide_input=True, confirmation_prompt=confirm)
    return value
