"""The dtypes a grid may ask for and their sizes: plain data, so config checks import no torch."""

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
