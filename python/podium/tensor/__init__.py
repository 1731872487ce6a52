"""podium.tensor: distributed tensors (``mesh.activate()``), see docs/tensor.md."""
