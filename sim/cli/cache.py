"""``pdsim cache ...``: cache-policy tools (trace replay, miss-ratio curves)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Cache-policy tools: trace replay and miss-ratio curves.", no_args_is_help=True)
