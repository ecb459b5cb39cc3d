"""hybridserve's OpenAI-compatible P/D proxy (FastAPI + httpx): app.py, hops.py, streaming.py, routing.py."""
