"""The gateway overhead benchmark: ``python bench/run.py`` (see run.py)."""
