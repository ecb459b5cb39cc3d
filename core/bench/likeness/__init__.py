"""Whether bench's targets serve alike: each engine's settings parsed (engine_settings.py), read for a target
(readings.py), compared (alike.py), and checked before anything is measured (before_measuring.py)."""
