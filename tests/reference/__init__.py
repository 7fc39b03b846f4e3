"""Hand-written PyTorch ports of real models, the references that compiled ports are measured against."""
