"""The version, apart from the package so that importing it imports nothing else."""

__version__ = "0.1.0"
