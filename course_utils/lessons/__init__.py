"""One module per notebook: its charts, widgets and auto-checked exercises, over the core's arithmetic.

A notebook imports its lesson as ``from course_utils.lessons import memory_budget as lesson``. A lesson module
imports the core (``course_utils.quant``, ``memory``, ...), :mod:`~course_utils.lessons.kit`, and only lessons
that come earlier in :data:`course_utils.about.NOTEBOOKS`; the core never imports ``lessons``
(``tests/test_structure.py`` holds these rules).
"""
