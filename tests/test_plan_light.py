"""`plan` runs without torch, nixl or vllm: none of them is imported on its path."""

import json
import subprocess
import sys

CODE = """
import sys, json
sys.argv = ["hybridserve", "plan", "-m", "all", "--tp", "1", "--tp", "2", "--memory", "h200", "--json"]
from hybridserve.cli.app import main
try:
    main()
except SystemExit as exc:
    heavy = sorted(m for m in ("torch", "nixl", "vllm", "numpy", "fastapi") if m in sys.modules)
    print(json.dumps({"code": exc.code, "heavy": heavy}), file=sys.stderr)
"""


def test_plan_imports_no_heavy_package():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}
    assert len(json.loads(proc.stdout)) == 20
