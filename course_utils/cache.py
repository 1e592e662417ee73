"""Where the course keeps models it builds or converts: one cache folder, outside the repository.

``$COURSE_UTILS_CACHE`` if set, else ``~/.cache/course_utils`` (``$XDG_CACHE_HOME`` respected). Where that folder
cannot be created (a read-only home), :func:`writable_cache_dir` falls back to the system's temporary folder.
Nothing heavy is imported here (no torch), so the online/offline decision can look into the cache cheaply.
"""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

#: The cache folder when ``COURSE_UTILS_CACHE`` is not set (never inside the repo).
_DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "course_utils"


def cache_dir() -> Path:
    """The course's cache folder: ``$COURSE_UTILS_CACHE``, else ``~/.cache/course_utils``."""
    return Path(os.environ.get("COURSE_UTILS_CACHE", "") or _DEFAULT_CACHE)


def fallback_dir() -> Path:
    """The cache used when :func:`cache_dir` cannot be created: ``<system temp>/course_utils``."""
    return Path(tempfile.gettempdir()) / "course_utils"


def writable_cache_dir(folder: str | Path | None = None) -> Path:
    """``folder`` (created; an error if it cannot be), else :func:`cache_dir`, else :func:`fallback_dir`."""
    bases = [Path(folder)] if folder is not None else [cache_dir(), fallback_dir()]  # a folder given is never replaced
    for base in bases:
        with contextlib.suppress(OSError):
            base.mkdir(parents=True, exist_ok=True)
            return base
    raise OSError(f"cannot create {' or '.join(map(str, bases))}: set COURSE_UTILS_CACHE to a writable folder")


def build_once(target: Path, build: Callable[[Path], None], complete: Callable[[Path], bool]) -> Path:
    """Run ``build(tmp)`` in a temporary folder beside ``target``, then rename it to ``target``; return ``target``.

    An interrupted build leaves nothing half-written. When another process finished the same build first,
    theirs is kept (``complete(target)`` says whether it is whole).
    """
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    return target
