"""The version of the mcstore Python package: the one place it is written (pyproject.toml reads
it from here at build time, mcstore.__version__ re-exports it)."""

__version__ = "0.1.0"
