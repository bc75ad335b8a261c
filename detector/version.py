"""The package's version, importing nothing, so any layer may read it (``detector --version`` does where the
installed distribution's metadata is missing: a checkout on ``PYTHONPATH``)."""

__version__ = "0.1.0"  # pyproject.toml's [project] version; tests/test_version.py keeps the two equal
