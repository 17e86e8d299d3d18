"""The command line's error boundary (tr_cli/cli/errors.py) around a command that fails in a way
nobody foresaw: one line and exit 1, the traceback only with TR_DEBUG=1; Typer's own usage
errors keep their exit status 2."""

import typer
from typer.testing import CliRunner

from tr_cli.cli.errors import ErrorBoundary

app = typer.Typer(cls=ErrorBoundary)


@app.command()
def fail(times: int) -> None:
    """Divide by zero `times` times."""
    raise ZeroDivisionError("division by zero\nsecond line")


@app.command()
def ok() -> None:
    typer.echo("fine")


def test_an_unexpected_exception_is_one_line_without_its_traceback(monkeypatch):
    monkeypatch.delenv("TR_DEBUG", raising=False)
    out = CliRunner().invoke(app, ["fail", "3"])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [
        "tr: error: unexpected ZeroDivisionError: division by zero (TR_DEBUG=1 shows the traceback)"
    ]


def test_tr_debug_lets_the_traceback_through(monkeypatch):
    monkeypatch.setenv("TR_DEBUG", "1")
    out = CliRunner().invoke(app, ["fail", "3"])
    assert out.exit_code == 1 and isinstance(out.exception, ZeroDivisionError)


def test_usage_errors_stay_typers():
    out = CliRunner().invoke(app, ["fail", "three"])
    assert out.exit_code == 2 and "Invalid value" in out.output and "unexpected" not in out.output
