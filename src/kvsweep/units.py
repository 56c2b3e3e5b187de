"""Units kvsweep counts and prints sizes in, for every layer (planning, measuring, the report), and the dtypes a
grid may ask for with their sizes: plain data, so config checks import no torch.
"""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


MIB = 1 << 20
GB = 10**9  # what the config's *_gb keys and the plan's host and device sizes count in
