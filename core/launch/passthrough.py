"""vLLM flags passed through `launch` (`--vllm-arg`, everything after `--`, topology `engine.vllm_args` and an
instance's `extra_args`): refused where launch sets the same flag itself.

Which flags launch sets comes from the list that writes the engine's command line (engine_command.engine_flags,
plus placement's), never from a list kept here. A passed flag is matched the way vLLM's parser reads it
(vllm/utils/argparse_utils.py, FlexibleArgumentParser, and Python's argparse under it):
- `--flag=value` is `--flag`; `--max_model_len` is `--max-model-len` (underscores become dashes in the name);
- `--kv-transfer-config.kv_role x` sets a field of `--kv-transfer-config` (the JSON dotted form);
- `--no-enable-prefix-caching` is the negative of `--enable-prefix-caching` (argparse.BooleanOptionalAction);
- a unique prefix such as `--max-model` is `--max-model-len` (argparse's allow_abbrev, on by default).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hybridserve.core.common.errors import InputError


@dataclass(frozen=True)
class EngineFlag:
    """One vLLM flag launch decides for an engine: what it writes (empty: launch leaves vLLM's default, on purpose)
    and the launch option or topology key that sets it. The same list writes the command line and names what
    `--vllm-arg` may not override (here), so the two cannot drift."""

    name: str  # the flag as vLLM's parser knows it, positive form ("--enable-prefix-caching")
    argv: tuple[str, ...]
    set_by: str  # how the operator sets it instead, or why it is fixed
    aliases: tuple[str, ...] = ()  # vLLM's short forms (engine/arg_utils.py: "-tp", "-sc")
    is_secret: bool = False  # its value is a key: a refusal names the flag only, never `--flag=value`


MIN_PREFIX = 3  # "--p" is no flag anyone means; argparse refuses prefixes that match several flags anyway


def flag_name(token: str) -> str | None:
    """The long flag a command-line token names, in vLLM's spelling and positive form; None for a value."""
    if not token.startswith("--") or token == "--":
        return token.split("=", 1)[0] if token.startswith("-") and not _is_number(token) else None
    name = token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    return "--" + (name[3:] if name.startswith("no-") else name)


def owner(token: str, owned: Iterable[EngineFlag]) -> EngineFlag | None:
    """The launch-set flag that `token` would override, or None."""
    name = flag_name(token)
    if name is None:
        return None
    owned = tuple(owned)
    for flag in owned:
        if name == flag.name or name in flag.aliases:
            return flag
    if name.startswith("--") and len(name) - 2 >= MIN_PREFIX:
        prefixed = [flag for flag in owned if flag.name.startswith(name)]
        if len(prefixed) == 1:
            return prefixed[0]
    return None


def passed_value(tokens: tuple[str, ...], name: str) -> str | None:
    """The value the last `name VALUE` or `name=VALUE` among `tokens` gives (argparse: the last one wins)."""
    value = None
    for i, token in enumerate(tokens):
        if flag_name(token) != name:
            continue
        if "=" in token:
            value = token.split("=", 1)[1]
        elif i + 1 < len(tokens):
            value = tokens[i + 1]
    return value


def check_passthrough(tokens: Iterable[str], owned: Iterable[EngineFlag], *, what: str) -> None:
    """Raise InputError naming the first token that overrides a flag launch sets, and the option that sets it."""
    owned = tuple(owned)
    for token in tokens:
        flag = owner(token, owned)
        if flag is not None:
            shown = token.split("=", 1)[0] if flag.is_secret else token  # `--api-key=KEY` names the flag only
            raise InputError(f"{what} {shown}: launch sets {flag.name} itself ({flag.set_by}); accepted: "
                             f"vLLM flags launch does not set")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
