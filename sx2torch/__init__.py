"""sx2torch: compile SexpGPU models into readable PyTorch modules."""

from sx2torch.api import (
    SourceWarning,
    compile_file,
    compile_string,
    explain,
    load,
    load_string,
)
from sx2torch.errors import SourceError, UsageError
from sx2torch.version import __version__

__all__ = [
    "__version__",
    "SourceError",
    "SourceWarning",
    "UsageError",
    "compile_file",
    "compile_string",
    "explain",
    "load",
    "load_string",
]
