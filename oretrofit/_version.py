"""The package version (a leaf module, so that any module can read it without an import loop)."""

__version__ = "0.1.0"
