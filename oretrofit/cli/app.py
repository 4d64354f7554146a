"""The typer application: registers each verb module. Results go to stdout, progress to stderr."""

from __future__ import annotations

import typer

app = typer.Typer(name="oretrofit", no_args_is_help=True, add_completion=False,
                  help="Retrofit O-components into pretrained transformer hosts.")

# One line per verb module; each module defines `register(app)`.
from . import sweep  # noqa: E402
from . import experiment  # noqa: E402
from . import pretrain  # noqa: E402
from . import regress  # noqa: E402
from . import patch  # noqa: E402

sweep.register(app)
experiment.register(app)
pretrain.register(app)
regress.register(app)
patch.register(app)


def main() -> None:
    from .errors import run
    run(app)                    # errors print as plain text (no traceback, no rich markup)
