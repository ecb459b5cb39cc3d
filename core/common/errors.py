"""Typed errors. The CLI's one top-level handler maps each to a one-line message and an exit code."""


class HybridserveError(Exception):
    """Base of every error the library raises on purpose."""

    exit_code = 2


class InputError(HybridserveError):
    """An input was refused: the message names the input and what is accepted (exit 2)."""


class MissingExtraError(HybridserveError):
    """An optional dependency is missing: the message says which extra to install (exit 2)."""

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        from hybridserve.core.common.install_hint import install_command

        super().__init__(f"{purpose} needs '{module}': install it with  {install_command(extra)}")


class CouldNotRunError(HybridserveError):
    """Something needed to run the check could not be had (a server, a peer, a GPU): exit 2."""


class CheckFailedError(HybridserveError):
    """A check ran and found a regression or a wrong result (exit 1)."""

    exit_code = 1
