"""kvsweep: measure Transformers KV cache strategies on Ray, log them to MLflow, and pick one."""

__version__ = "0.1.0"
