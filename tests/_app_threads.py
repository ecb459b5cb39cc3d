"""ASGI apps served by uvicorn in threads of the test process, each on a free port, for tests that need real HTTP
servers but no vLLM (fake engines behind validate, the front key)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from _ports import free_port


@contextlib.contextmanager
def served_apps(apps: dict) -> Iterator[dict[str, str]]:
    """name -> app in, name -> URL out, every server started before the body and stopped after it."""
    import uvicorn

    urls, handles = {}, []
    try:
        for name, api in apps.items():
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="error"))
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            handles.append((server, thread))
            deadline = time.monotonic() + 20
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.started, f"test server {name} did not start"
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for server, thread in handles:
            server.should_exit = True
            thread.join(timeout=10)
