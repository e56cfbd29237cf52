"""The package version: written here only (pyproject.toml reads it at build time)."""

__version__ = "0.1.0"
