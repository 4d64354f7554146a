"""The typer application: the product verbs first, the paper's runners in one group, the demo
host's tools in another. Results go to stdout, progress to stderr.

Each verb module defines ``register(app)``. Nothing here imports torch: the verbs import their
work when they run, so ``oretrofit --help`` answers at once.
"""

from __future__ import annotations

import typer
import typer.core

from . import calibrate, check, demo_host, experiment, patch, regress, reproduce, sweep
from .errors import interrupted

# The order `oretrofit --help` lists the verbs in; a verb not named here comes after these.
ORDER = ("patch", "check", "calibrate", "regress", "reproduce", "tables", "sweep", "experiment",
         "demo-host")


class _Verbs(typer.core.TyperGroup):
    def invoke(self, ctx: typer.Context) -> object:
        """Run the verb; a Ctrl-C says what it left behind (typer would exit 130 silently)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise interrupted() from None

    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))


app = typer.Typer(name="oretrofit", cls=_Verbs, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Retrofit O-components into pretrained transformer hosts.")


def _print_version(asked: bool) -> None:
    if asked:
        from .. import __version__
        typer.echo(f"oretrofit {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version,
                                          is_eager=True, help="Print the version and exit.")
             ) -> None:
    pass

patch.register(app)
check.register(app)
calibrate.register(app)

# regress.py registers `regress`, `reproduce TABLE` and `tables`; the first and last are verbs of
# their own, and `reproduce TABLE` becomes `reproduce table2|table7` in the reproduce group.
_regress = typer.Typer()
regress.register(_regress)
_runners = {info.name: info.callback for info in _regress.registered_commands}
app.registered_commands += [info for info in _regress.registered_commands
                            if info.name in ("regress", "tables")]
reproduce.register(app, {**_runners, "experiment": experiment.experiment,
                         "operators": sweep.operators})
sweep.register(app)
experiment.register(app)
demo_host.register(app)

# One line each in `oretrofit --help` (a verb's docstring may run past the 80 columns it gets there).
SUMMARIES = {"patch": "Retrofit a TabPFN v3 checkpoint and list its patched sites.",
             "calibrate": "Choose τ per site from a host's carriers on calibration data.",
             "regress": "Run a dataset × seed × arm × τ matrix of TabPFN v3 fits.",
             "tables": "Render run folders' tables and plots beside the paper's values.",
             "experiment": "Run or resume one of the paper's learned-model studies."}
for _info in app.registered_commands:
    if _info.name in SUMMARIES:
        _info.short_help = SUMMARIES[_info.name]


def main() -> None:
    from .errors import run
    from .output import show_progress
    show_progress()
    run(app)                    # errors print as plain text (no traceback, no rich markup)


if __name__ == "__main__":
    main()
