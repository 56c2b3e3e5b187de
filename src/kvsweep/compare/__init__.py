"""Two sweeps side by side (`python -m kvsweep compare`): cells matched by grid coordinates, a verdict per
metric beyond both runs' noise, what differs between their environments. Reads results, never MLflow."""
