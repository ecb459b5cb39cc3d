"""The two consoles: results on stdout, messages and progress on stderr (so `--json` stays clean)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

out_console = Console()
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
