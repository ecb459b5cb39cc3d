"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Profile name, config.json path or model folder.")]
# metavar "": a flag, shown without typer's "<bool>" (which reads as if it took a value)
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print only the result as JSON on stdout.")]
YamlOpt = Annotated[bool, typer.Option("--yaml", metavar="", help="Print only the result as YAML on stdout.")]
DtypeOpt = Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32.")]
# verify/tune: `--tp 1 2 4 8`; the values after the first arrive as extra arguments (see `trailing_values`).
TpsOpt = Annotated[Optional[list[int]], typer.Option("--tp", help="TP sizes: --tp 1 2 4 8 (default: 1 2 4 8).")]
DEFAULT_TPS = (1, 2, 4, 8)
# bench and validate: the servers they start themselves, as launch starts them
StartedDeviceOpt = Annotated[str, typer.Option("--device", help="Where started configurations run: cpu or cuda (as "
                                               "launch).")]
StartedGdnBackendOpt = Annotated[Optional[str], typer.Option("--gdn-prefill-backend", help="vLLM "
                                                             "--gdn-prefill-backend of started servers.")]
StartedBasePortOpt = Annotated[int, typer.Option("--base-port", help="Ports of started configurations (proxy; P "
                                                "+100, D +200).")]
StartedRunDirOpt = Annotated[Path, typer.Option("--run-dir", help="Folder for the started servers' logs.")]


def started_timeout_opt(request_default_s: int) -> object:
    """--timeout of a command that sends requests and may start servers (bench: 600 s a request, validate: 300)."""
    return Annotated[Optional[float], typer.Option(
        "--timeout", show_default=False, help=f"Seconds per request (default {request_default_s}), and to wait for "
        "started servers (default: launch's, CPU 300, CUDA 900).")]


StartedEagerOpt = Annotated[Optional[bool], typer.Option(
    "--enforce-eager/--no-enforce-eager", show_default=False,
    help="Started servers skip torch.compile and CUDA graphs (faster start). Default: as launch (CPU on, CUDA off).")]


def trailing_values(tp: list[int] | None, extra: list[str], *,
                    takes_shapes: bool = False) -> tuple[tuple[int, ...], list[str]]:
    """Typer options take one value each, so `--tp 1 2 4 8 --shapes 1x1024 4x4096` leaves '2 4 8 4x4096' as extra
    arguments (commands registered with allow_extra_args). Integers are more TP sizes; NxL texts are more batch
    shapes where the command takes them (`takes_shapes`); anything else is refused. Returns the TP sizes (default
    DEFAULT_TPS) and the shape texts."""
    from hybridserve.core.common.errors import InputError
    from hybridserve.kernels.grid import is_shape_text

    tps, shapes = list(tp or []), []
    for value in extra:
        if value.strip().isdigit():
            tps.append(int(value))
        elif takes_shapes and is_shape_text(value):
            shapes.append(value)
        else:
            accepted = "after --tp: integers" + (", after --shapes: NxL" if takes_shapes else "")
            raise InputError(f"unexpected argument {value!r}; accepted {accepted}")
    return tuple(tps) or DEFAULT_TPS, shapes
