"""Before a release: do about.VERSION, pyproject's version, every notebook's setup cell and the git tag agree?

Every notebook's setup cell installs the helpers from the git tag ``v{VERSION}`` (its ``RELEASE`` and ``HELPERS``
lines, written by scripts/build_notebooks.py from course_utils/about.py). This prints one line per problem and
exits 1, or prints one line saying all agree and exits 0:

    python scripts/release_check.py             # this repository
    python scripts/release_check.py --root DIR  # another checkout

It reads the files and ``git tag --list``; it never creates, pushes or changes anything (see CONTRIBUTING.md,
"Releasing").
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The lines of a setup cell that pin the helpers (as scripts/setup_cell.py writes them).
_RELEASE = re.compile(r"^RELEASE = (['\"])(?P<value>.*?)\1", re.M)
_HELPERS = re.compile(r"^HELPERS = os\.environ\.get\(SOURCE_ENV\) or (['\"])(?P<value>.*?)\1", re.M)


def read_about(root: Path) -> tuple[str, str]:
    """(VERSION, REPO) as written in ``root``'s course_utils/about.py."""
    text = (root / "course_utils" / "about.py").read_text(encoding="utf-8")
    values = [re.search(rf'^{name} = "(.+?)"', text, re.M) for name in ("VERSION", "REPO")]
    if None in values:
        raise ValueError(f"{root / 'course_utils' / 'about.py'} must set VERSION and REPO on lines of their own")
    return values[0].group(1), values[1].group(1)


def pyproject_version(root: Path) -> str | None:
    """The ``version = "..."`` of ``root``'s pyproject.toml, or None when it has none."""
    found = re.search(r'^version = "(.+?)"', (root / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else None


def setup_pins(notebook: Path) -> tuple[str | None, str | None]:
    """(RELEASE, HELPERS) pinned in the notebook's setup cell; None for a value it does not set."""
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    for cell in cells:
        source = "".join(cell.get("source", []))
        release = _RELEASE.search(source) if cell.get("cell_type") == "code" else None
        if release is not None:
            helpers = _HELPERS.search(source)
            return release.group("value"), helpers.group("value") if helpers else None
    return None, None


def git_tags(root: Path) -> list[str]:
    """The tags of the git repository at ``root`` (``git tag --list``)."""
    done = subprocess.run(["git", "-C", str(root), "tag", "--list"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git tag --list failed in {root}: {done.stderr.strip()}")
    return done.stdout.split()


def problems(root: Path, tags: list[str]) -> list[str]:
    """One line per disagreement between about.py, pyproject.toml, the notebooks' setup cells and ``tags``."""
    version, repo = read_about(root)
    tag = f"v{version}"
    spec = f"course-utils @ git+https://github.com/{repo}@{tag}"
    found = []
    if pyproject_version(root) != version:
        found.append(f"pyproject.toml: version is {pyproject_version(root)!r}, about.VERSION is {version!r}")
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    if not notebooks:
        found.append(f"{root / 'notebooks'}: no notebooks found")
    for notebook in notebooks:
        release, helpers = setup_pins(notebook)
        name = f"notebooks/{notebook.name}"
        if release is None:
            found.append(f"{name}: no setup cell with a RELEASE line")
            continue
        if release != tag:
            found.append(f"{name}: setup cell pins RELEASE {release!r}, not {tag!r}: rebuild the notebooks")
        if helpers != spec:
            found.append(f"{name}: setup cell installs {helpers!r}, not {spec!r}: rebuild the notebooks")
    if tag not in tags:
        found.append(
            f"git tag {tag} does not exist: on the release commit run `git tag {tag} && git push origin {tag}`"
        )
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: ``--root``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to check (default: this one)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print each problem on a line of its own and return 1, or one line that all agree and return 0."""
    root = parse_args(argv).root
    found = problems(root, git_tags(root))
    for line in found:
        print(line, file=sys.stderr)
    if found:
        return 1
    version, _ = read_about(root)
    print(f"release v{version}: about.py, pyproject.toml, every notebook's setup cell and the git tag agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
