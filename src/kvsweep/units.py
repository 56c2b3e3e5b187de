"""Units kvsweep prints sizes in, for every layer (planning, measuring, the report)."""

MIB = 1 << 20
GB = 10**9  # what the config's *_gb keys and the plan's host and device sizes count in
