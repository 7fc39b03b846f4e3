"""The Python API: compile a source to a module's text, load it as a module, explain it.

Errors in the source raise `SourceError`, whose `str()` is the command line's diagnostic;
warnings are issued as `SourceWarning`s (`warnings.simplefilter("error", SourceWarning)`
makes them errors, as `--warn error` does). Importing this costs nothing: the compiler is
imported by the first call, so a generated module's `from sx2torch import runtime` stays light.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional

from sx2torch.errors import SourceError, UsageError
from sx2torch.version import __version__

MAX_SOURCE = 16 << 20  # bytes; a model is a few KiB, and /dev/zero never ends


class SourceWarning(UserWarning):
    """A located warning about the source: `str()` is `FILE:LINE:COL: warning: ...`."""


_loaded: dict = {}  # (source text, run, target) digest -> module
_folder: list = []  # the temporary folder of the loaded modules' files, made once


def compile_string(
    text: str, filename: str = "<string>", run: Optional[str] = None, target="cuda"
) -> str:
    """The module `text` (str, or bytes read as a file's) compiles to, as `sx2torch FILE`
    prints it."""
    from sx2torch.compiler import Options, compile_module

    text = source_text(text, filename)
    try:
        compiled = compile_module(text, filename, Options(run=run, target=target))
    except SourceError as error:
        raise error.located(filename, text) from None
    for found in compiled.warnings:
        error = SourceError(found.span, found.message)
        warnings.warn(error.render(filename, text, "warning"), SourceWarning, 2)
    return compiled.code


def compile_file(path, run: Optional[str] = None, target="cuda") -> str:
    """The module the file at `path` compiles to."""
    return compile_string(_text(path), str(path), run, target)


def load(path, run: Optional[str] = None, target="cuda"):
    """The file at `path` compiled and imported, as a module whose classes you build
    (`load("rms-mlp.lisp").RmsMlp()`); a source whose text is unchanged is loaded once.
    """
    text = _text(path)
    key = hashlib.sha256(
        "\0".join([__version__, text, repr(run), repr(target)]).encode()
    ).hexdigest()[:16]
    if key not in _loaded:
        code = compile_string(text, str(path), run, target)
        name = f"sx2torch_loaded_{key}"
        if not _folder:
            _folder.append(tempfile.TemporaryDirectory(prefix="sx2torch-"))
        file = Path(_folder[0].name) / f"{name}.py"
        file.write_text(code, "utf-8")
        from sx2torch.runtime import located

        located.sources[str(file)] = str(Path(path).resolve())
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so that pickling a model finds its class
        spec.loader.exec_module(module)
        _loaded[key] = module
    return _loaded[key]


def explain(path, run: Optional[str] = None, target="cuda") -> dict:
    """`sx2torch explain --json`'s report, as data."""
    from sx2torch.compiler import Options
    from sx2torch.tools import explain as explained

    text = _text(path)
    try:
        return explained.run(text, str(path), Options(run=run, target=target))
    except SourceError as error:
        raise error.located(str(path), text) from None


def _text(path) -> str:
    name = str(path)
    return decoded(read(name), name)[1]


def read(name: str) -> bytes:
    """The bytes of the source file `name` (`-`: standard input), as the command line
    reads them: a file that cannot be read, or past MAX_SOURCE, is a UsageError."""
    try:
        if name == "-":
            if sys.stdin is None:
                raise UsageError("cannot read -: there is no standard input")
            data = sys.stdin.buffer.read(MAX_SOURCE + 1)
        else:
            with open(name, "rb") as handle:
                data = handle.read(MAX_SOURCE + 1)
    except OSError as error:
        raise UsageError(f"cannot read {name}: {error.strerror}") from None
    if len(data) > MAX_SOURCE:
        raise UsageError(
            f"cannot read {name}: a source may have at most {MAX_SOURCE >> 20} MiB"
        )
    return data


def decoded(data: bytes, name: str) -> tuple:
    """(the text a diagnostic quotes, the source the compiler reads) of a file's bytes;
    bytes that are not UTF-8 are a SourceError located in `name`."""
    from sx2torch.syntax.read import decode

    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    try:
        return text, decode(data)
    except SourceError as error:
        raise error.located(name, text) from None


def source_text(text, filename: str) -> str:
    """A source given as a value (str, or bytes decoded as a file's are), held to the
    limit a file is."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_SOURCE:
            raise UsageError(f"a source may have at most {MAX_SOURCE >> 20} MiB")
        return decoded(bytes(text), filename)[1]
    if not isinstance(text, str):
        raise UsageError(f"a source is str or bytes, got {type(text).__name__}")
    # a character is at least one byte: the length bounds the encoding's work
    if (
        len(text) > MAX_SOURCE
        or len(text.encode("utf-8", "surrogatepass")) > MAX_SOURCE
    ):
        raise UsageError(f"a source may have at most {MAX_SOURCE >> 20} MiB")
    return text
