"""The sections, by the lessons they check: ``machine`` (1-2), ``loops`` (3-4), ``memory`` (5), ``models`` (6-8),
``timeline`` (9). Each section is a function ``(ctx, out)`` that records its checks, tables and notes in ``out``."""
