"""Pass 7, format: the emitted module's text -> black's formatting of it."""

import black


def run(code: str) -> str:
    return black.format_str(code, mode=black.Mode())
