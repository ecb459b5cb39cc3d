"""The project's P/D on Ray Serve LLM (`launch --engine ray`, `export ray|kuberay`): Ray places, restarts and routes;
the project brings the plan (the same LaunchPlan as launch), its hybrid rules, its plugin and its front door.

Pure modules (no `ray` import; a dry run and the exports work without the `ray` extra): engine_kwargs, serve_config,
kuberay. Modules that import ray: app (the Serve builder), servers (the prefill and decode replicas), cluster, deploy.
"""
