"""The hybridserve command line: wires one module per command; each parses, calls the library and renders."""

from __future__ import annotations

import typer

from hybridserve.cli import bench, export, launch, plan, step_profile, transfer, tune, validate, verify
from hybridserve.cli.error_exit import guarded
from hybridserve.cli.help import HelpCommand, HelpGroup

app = typer.Typer(
    name="hybridserve",
    cls=HelpGroup,
    help="Plan, tune, launch and validate hybrid GDN + attention models on vLLM with P/D over NIXL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Plan, tune, launch and validate hybrid GDN + attention models on vLLM with P/D over NIXL."""


# Register only commands that work. Each command module exposes `command`; sub-apps expose `app`.
app.command("plan", cls=HelpCommand)(guarded(plan.command))
# verify/tune take `--tp 1 2 4 8` and `--shapes 1x1024 4x4096`: the values after the first arrive as extra args.
_MANY = {"allow_extra_args": True}
app.command("verify", cls=HelpCommand, context_settings=_MANY)(guarded(verify.command))
app.command("tune", cls=HelpCommand, context_settings=_MANY)(guarded(tune.command))
app.command("launch", cls=HelpCommand)(guarded(launch.command))
app.command("validate", cls=HelpCommand, context_settings=_MANY)(guarded(validate.command))  # --prompt-len 1k 8k
app.command("bench", cls=HelpCommand)(guarded(bench.command))
app.command("step-profile", cls=HelpCommand)(guarded(step_profile.command))
app.add_typer(transfer.app, name="transfer")
app.add_typer(export.app, name="export")


def main() -> None:
    """Console entry point. Usage errors (a value click cannot parse) also become one line and exit 2."""
    import sys

    from typer.exceptions import TyperException

    from hybridserve.cli.console import err_console

    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except TyperException as exc:  # typer's click: UsageError, BadParameter, NoSuchOption, MissingParameter
        if not hasattr(exc, "format_message"):
            raise
        ctx = getattr(exc, "ctx", None)
        where = f" (try 'hybridserve {ctx.info_name} --help')" if ctx is not None and ctx.parent else ""
        if exc.format_message():  # no_args_is_help has already printed the help
            err_console.print(f"error: {exc.format_message()}{where}", highlight=False, soft_wrap=True,
                              markup=False)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
