"""sx2torch: compile SexpGPU models into readable PyTorch modules."""

__version__ = "0.1.0"

from sx2torch.api import (  # noqa: E402 (the API reads __version__)
    SourceWarning,
    compile_file,
    compile_string,
    explain,
    load,
)
from sx2torch.errors import SourceError, UsageError  # noqa: E402

__all__ = [
    "SourceError",
    "SourceWarning",
    "UsageError",
    "compile_file",
    "compile_string",
    "explain",
    "load",
]
