"""Typed transfer errors: each names the peer and the phase it failed in (one line, exit 2)."""

from __future__ import annotations

from hybridserve.core.common.errors import CouldNotRunError, InputError


class TransferError(CouldNotRunError):
    """A step with a peer failed: connect, metadata, compat, prepare, transfer, notify, release."""

    def __init__(self, *, peer: str, phase: str, detail: str) -> None:
        super().__init__(f"peer {peer!r}, phase {phase}: {detail}")
        self.peer = peer
        self.phase = phase
        self.detail = detail

    def __reduce__(self):  # crosses process boundaries (rank processes report errors to the driver)
        return _restore, (type(self), self.args, self.__dict__)


class TransferTimeout(TransferError):
    """A wait ran past its deadline (NIXL's own waits never raise, so every wait here has one)."""

    def __init__(self, *, peer: str, phase: str, timeout_s: float, detail: str = "") -> None:
        text = f"no answer within {timeout_s:.1f} s" + (f" ({detail})" if detail else "")
        super().__init__(peer=peer, phase=phase, detail=text)
        self.timeout_s = timeout_s


class IncompatiblePeerError(InputError):
    """The handshake found the two sides laid out differently: names the field and both values."""


class DescriptorRangeError(InputError):
    """A descriptor falls outside the registered regions: refused before any byte moves."""


def _restore(cls: type, args: tuple, state: dict) -> Exception:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc
