"""Units kvsweep prints sizes in, for every layer (planning, measuring, the report)."""

MIB = 1 << 20
