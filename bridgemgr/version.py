"""The package's version, importable from every layer (the package itself is above them)."""

__version__ = "0.1.0"
