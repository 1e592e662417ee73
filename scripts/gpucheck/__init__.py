"""The parts of ``scripts/gpu_check.py`` (its module doc describes the whole check), each readable alone.

- ``settings``: the budget, the sizes of the cases, the exit statuses, the offline environment;
- ``gpu``: is there a CUDA GPU (decided before any heavy import), what it is, clearing its allocator;
- ``runner``: what a section gets and returns, its time and its errors; running the sections in order;
- ``plan``: what each section runs on this GPU, the caps fitted to the budget, the dry run's plan;
- ``sections``: the sections themselves, by lesson;
- ``children``: ending the child processes the run started, and the watchdog that stops it at its budget;
- ``report``: the verdict (exit status, --strict, not checked, the summary line), gpu_check.json and .md;
- ``cli``: the command line, and the run from start to end.
"""
