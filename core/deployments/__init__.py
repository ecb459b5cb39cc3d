"""Deployments: name one (a URL or a configuration), start it through launch, talk to it, stop it: what bench,
validate, chaos and sizing share."""
