"""Developer tools for sx2torch (not part of the installed package)."""
