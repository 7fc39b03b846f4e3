"""The version of sx2torch, which every generated module's header names."""

__version__ = "0.1.0"
