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

from sx2torch.errors import SourceError
from sx2torch.version import __version__


class SourceWarning(UserWarning):
    """A located warning about the source: `str()` is `FILE:LINE:COL: warning: ...`."""


_loaded: dict = {}  # (source text, run, target) digest -> module
_folder: list = []  # the temporary folder of the loaded modules' files, made once


def compile_string(
    text: str, filename: str = "<string>", run: Optional[str] = None, target="cuda"
) -> str:
    """The module `text` compiles to, as `sx2torch FILE` prints it."""
    from sx2torch.compiler import Options, compile_module

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
    return _import(_text(path), str(path), run, target, Path(path).resolve())


def load_string(
    text: str, filename: str = "<string>", run: Optional[str] = None, target="cuda"
):
    """`text` compiled and imported as `load` imports a file, without `exec`
    (`load_string(text).Model()`: the class is named after `filename`, `Model` for a
    name in angle brackets); its text is kept beside the module, so that a run-time
    error names its lines."""
    return _import(text, filename, run, target, None)


def _import(text: str, filename: str, run, target, source: Optional[Path]):
    key = hashlib.sha256(
        "\0".join([__version__, text, filename, run or "", target]).encode()
    ).hexdigest()[:16]
    if key not in _loaded:
        code = compile_string(text, filename, run, target)
        name = f"sx2torch_loaded_{key}"
        if not _folder:
            _folder.append(tempfile.TemporaryDirectory(prefix="sx2torch-"))
        file = Path(_folder[0].name) / f"{name}.py"
        file.write_text(code, "utf-8")
        if source is None:  # named so that compiling it again names the same class
            from sx2torch.compiler import top_model_name

            source = file.with_suffix("") / f"{top_model_name(filename)}.lisp"
            source.parent.mkdir()
            source.write_text(text, "utf-8")
        from sx2torch.runtime import located

        located.sources[str(file)] = str(source)
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
    from sx2torch.syntax.read import decode

    data = Path(path).read_bytes()
    try:
        return decode(data)
    except SourceError as error:
        raise error.located(str(path), data.decode("utf-8", "replace")) from None
