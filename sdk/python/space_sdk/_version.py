"""The version of this package (also in ``pyproject.toml``)."""

__version__ = "0.2.0"
