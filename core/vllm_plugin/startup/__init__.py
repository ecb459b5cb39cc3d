"""A folder `launch` puts first on the vLLM servers' PYTHONPATH: its sitecustomize.py runs in every process."""
