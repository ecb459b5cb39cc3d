"""The deployment's two keys, which travel by file or environment, never on a command line or in a log.

- The front key (`launch --api-key-file`, topology `proxy: {api_key_file}`): the project's proxy asks every client
  for it (`Authorization: Bearer`), except on /health and /metrics (core/proxy/auth.py).
- The engine key (topology `engine: {api_key_file}`): only the proxy holds it; each engine gets it as
  `VLLM_API_KEY` (vLLM's own check) and the project's guard middleware, which also closes what vLLM leaves open
  (/invocations, /tokenize, /detokenize, ...). With a front key and no engine key file, launch generates one per
  deployment into the run folder (`engine.key`, mode 0600); a launch of one role of a multi-host topology cannot,
  since every host must read the same key, so there the topology must name the file.

A key is one line of 16 or more visible ASCII characters. No message here ever holds a key, only its file's path.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hybridserve.core.common.contracts import ENGINE_KEY_ENV
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.topology import ProxyKind, Topology

GENERATED_ENGINE_KEY = Path("engine.key")  # relative: inside the run folder (each role's working directory)
MIN_KEY_CHARS = 16
_ACCEPTED = f"accepted: a file holding one line of {MIN_KEY_CHARS} or more visible ASCII characters " \
            f"(e.g. openssl rand -hex 32 > FILE; chmod 600 FILE)"


def read_key(path: Path, *, what: str) -> str:
    """The key in `path` (a trailing newline dropped); InputError naming `what` and the path, never the content."""
    try:
        text = path.read_text(encoding="ascii")
    except UnicodeDecodeError:
        raise InputError(f"{what} {path}: not ASCII text; {_ACCEPTED}") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read it ({exc.strerror or type(exc).__name__}); "
                         f"{_ACCEPTED}") from None
    key = text[:-1] if text.endswith("\n") else text
    if "\n" in key or not all("!" <= c <= "~" for c in key):
        raise InputError(f"{what} {path}: holds more than one line, spaces or control characters; {_ACCEPTED}")
    if len(key) < MIN_KEY_CHARS:
        raise InputError(f"{what} {path}: the key is shorter than {MIN_KEY_CHARS} characters; {_ACCEPTED}")
    return key


def write_new_key(path: Path) -> None:
    """A fresh random key in a new file of mode 0600 (refused by the OS if the file exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")


def is_guarded(topology: Topology) -> bool:
    """Whether any key is set: the front door's or the engines'."""
    return topology.proxy.api_key_file is not None or topology.engine.api_key_file is not None


def engine_key_file(topology: Topology, *, starts_every_role: bool) -> Path | None:
    """The engine key's file as the roles read it: the topology's, else (with a front key) GENERATED_ENGINE_KEY in
    the run folder when this launch starts every role, else refused; None: the engines answer anyone."""
    check_keys(topology)
    if topology.engine.api_key_file is not None:
        return topology.engine.api_key_file
    if topology.proxy.api_key_file is None:
        return None
    if not starts_every_role:
        raise InputError("proxy api_key_file without engine api_key_file: a launch of one role cannot generate the "
                         "key every host must share; accepted: engine: {api_key_file: FILE} in the topology, the "
                         "same file on every host")
    return GENERATED_ENGINE_KEY


def check_keys(topology: Topology) -> None:
    """Refuse what would put a key where it shows: vllm-router (its --api-key is for its workers, on its command
    line, and it asks clients for none) and a VLLM_API_KEY in an instance's env (the dry run and plan.json show it)."""
    if is_guarded(topology) and topology.proxy.kind is ProxyKind.VLLM_ROUTER:
        raise InputError("--router vllm-router with an API key file: vllm-router 0.1.17 asks clients for no key "
                         "and takes its workers' key on its command line only; accepted with keys: --router "
                         "hybridserve")
    for kind, instances in (("prefill", topology.prefill), ("decode", topology.decode)):
        for i, inst in enumerate(instances):
            if any(name == ENGINE_KEY_ENV for name, _ in inst.env):
                raise InputError(f"{kind}[{i}]: env {ENGINE_KEY_ENV}: a key in the topology shows in the dry run "
                                 f"and plan.json; accepted: engine: {{api_key_file: FILE}}")


def check_key_files(front: Path | None, engine: Path | None) -> None:
    """Preflight of a real start: every key file this host's roles read is there and holds a key (a generated one,
    relative to the run folder, is written when the roles start)."""
    if front is not None:
        read_key(front, what="--api-key-file")
    if engine is not None and engine.is_absolute():
        read_key(engine, what="engine api_key_file")
