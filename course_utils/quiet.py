"""One way to keep library chatter off a notebook's output, and to leave the student's kernel as it was.

nbval compares stderr, and a class should not read progress bars and harmless library warnings.
:func:`quiet_libraries` silences them *inside* a ``with`` block only: on exit every warning filter, every
logger level it touched and transformers' verbosity and progress-bar switch are what they were before.
"""

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

#: The loggers silenced below ERROR inside the block.
_LOGGERS = ("bitsandbytes", "peft", "transformers", "accelerate", "torch._inductor", "torch._dynamo")


@contextmanager
def _quiet_loggers(names: tuple[str, ...] = _LOGGERS) -> Iterator[None]:
    """Let the loggers ``names`` show errors only inside the block; restore each one's own level after."""
    before = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, old in before.items():
            logging.getLogger(name).setLevel(old)


def import_bitsandbytes():
    """Import bitsandbytes quietly, or return None when it is not installed or cannot load.

    On CPUs with AVX-512-bf16, bitsandbytes logs a warning on import about an optional kernel package
    ("kernels") that would download from the Hugging Face Hub. It is harmless, but it lands on stderr,
    which nbval compares, so its logger shows errors only while it imports (its level is restored after).
    """
    with _quiet_loggers(("bitsandbytes",)):
        try:
            import bitsandbytes
        except Exception:  # noqa: BLE001 - missing, or a build without a backend for this machine
            return None
    return bitsandbytes


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence Python warnings, library loggers and transformers' progress bars inside the block; restore after.

    Imports transformers (and bitsandbytes, whose import logs a notice about an optional kernel package)
    the first time it runs, inside the quiet block.
    """
    with warnings.catch_warnings(), _quiet_loggers():
        warnings.simplefilter("ignore")
        import_bitsandbytes()
        from transformers.utils import logging as hf_logging

        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()
