"""The one place the version is written: pyproject.toml reads it (dynamic version), and
`explorer.__version__` and `widgets.__version__` re-export it."""

__version__ = "0.2.0"
