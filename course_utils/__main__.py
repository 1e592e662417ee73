"""``python -m course_utils``: see :mod:`course_utils.cli`."""

from course_utils.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
