"""Options shared by several commands, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Profile name, config.json path or model folder.")]
# metavar "": a flag, shown without typer's "<bool>" (which reads as if it took a value)
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print only the result as JSON on stdout.")]
YamlOpt = Annotated[bool, typer.Option("--yaml", metavar="", help="Print only the result as YAML on stdout.")]
DtypeOpt = Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32.")]
