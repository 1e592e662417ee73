"""Make a forked process start like a fresh one: map back the library pages that fork leaves out.

fork() copies a process's anonymous memory, but not the page-table entries of its file mappings (the libraries'
code and data): a forked process's resident memory lacks the library pages its parent had loaded until it touches
them again, so its baseline would read lower than that of a fresh process after the same imports.
:func:`resident_file_pages` lists those pages in the parent (Linux ``/proc/self/pagemap``); :func:`touch` maps them
back in the forked process. :mod:`course_utils.children` does both around each fork.
"""

import ctypes
import os
from contextlib import suppress
from pathlib import Path


def resident_file_pages() -> list[int]:
    """Addresses of this process's resident pages of readable mapped files (libraries), from /proc/self/pagemap.

    Where /proc cannot be read, the pages found so far (every one of them present and readable).
    """
    size = os.sysconf("SC_PAGE_SIZE")
    pages: list[int] = []
    with suppress(OSError), open("/proc/self/pagemap", "rb") as pagemap:
        for line in Path("/proc/self/maps").read_text(encoding="ascii", errors="replace").splitlines():
            fields = line.split()
            if len(fields) < 6 or not fields[5].startswith("/") or "r" not in fields[1]:
                continue  # anonymous memory is copied by fork; unreadable pages cannot be touched
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(start // size * 8)
            entries = pagemap.read((end - start) // size * 8)
            # bit 63 of a page's 8-byte entry: the page is present
            pages += [start + i * size for i in range(len(entries) // 8) if entries[8 * i + 7] & 0x80]
    return pages


def touch(pages: list[int]) -> None:
    """Read one byte of each page in ``pages`` (addresses from :func:`resident_file_pages`): that maps it in."""
    for address in pages:
        ctypes.c_char.from_address(address).value  # noqa: B018 - reading one byte maps the page in
