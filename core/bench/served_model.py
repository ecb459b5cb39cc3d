"""What an endpoint serves, from its /v1/models: the model name, its context length and where it was loaded from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridserve.core.common.errors import CouldNotRunError


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    name: str
    max_model_len: int | None  # vLLM's model card field
    root: str | None  # vLLM: the path or hub id the server loaded

    @property
    def local_folder(self) -> Path | None:
        """The model folder on this machine, when the server loaded one that is here too."""
        if not self.root:
            return None
        path = Path(self.root)
        return path if (path / "config.json").is_file() else None


def served_model(client: Any, url: str, name: str | None, headers: dict[str, str] | None = None) -> ServedModel:
    """The model called `name` (None: the first listed); `headers`: a guarded deployment's key."""
    import httpx

    try:
        response = client.get(f"{url}/v1/models", headers=headers)
        cards = response.json().get("data") or [] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise CouldNotRunError(f"endpoint {url}: GET /v1/models failed: {exc}") from None
    for card in cards:
        if name is None or card.get("id") == name:
            size = card.get("max_model_len")
            return ServedModel(name=str(card.get("id")), max_model_len=size if isinstance(size, int) else None,
                               root=card.get("root"))
    listed = ", ".join(str(c.get("id")) for c in cards) or "none"
    raise CouldNotRunError(f"endpoint {url}: /v1/models lists {listed}; wanted {name or 'any model'}")
