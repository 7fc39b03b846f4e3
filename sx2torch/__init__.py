"""sx2torch: compile SexpGPU models into readable PyTorch modules."""

__version__ = "0.1.0"
