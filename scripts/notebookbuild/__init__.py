"""The parts of ``scripts/build_notebooks.py`` (its module doc describes the command line), each readable alone.

- ``paths``: where the sources, the notebooks, their cell times, the README and the guide are;
- ``source``: a percent-format source read into cells, and the generated setup cell;
- ``notebook``: one notebook built from its source (header, ids, slides), outputs carried over from an executed one;
- ``write``: the build without executing: a fresh notebook without outputs, or ``--restamp`` (outputs kept);
- ``check``: ``--check``, a committed notebook against its source;
- ``execute``: ``--execute``, a notebook run top to bottom, its cell times recorded;
- ``slides``: ``--slides``, static reveal.js slides of the executed notebooks;
- ``times``: ``notebooks/cell_times.json``, each notebook's cell times and the machine that ran them;
- ``docs``: README.md's notebook table and run-time sentence, INSTRUCTORS.md's cell-time table, stamped or checked;
- ``cli``: the command line, one mode per run.

Slide types and study time come from ``scripts/notebook_layout.py``, the machine from ``scripts/machine_info.py``.
"""
