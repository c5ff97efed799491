"""The package version, importable without the API (tilecc/__init__ re-exports it)."""

__version__ = "0.1.0"
