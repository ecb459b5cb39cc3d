"""Errors, choice parsing and arithmetic shared by every concept of core."""
