"""A throwaway backend, "cpu-serial", that shows what adding a backend takes.

It is a variant of the CPU renderer that runs the blocks of a launch one after
the other on the calling thread (no OpenMP).  Everything it needs is in this
folder -- a renderer with its own pass list and Jinja skeleton, and the glue --
and one call registers it (``tests/backends/test_toy_backend.py``); no file of
kernforge changes.  docs/architecture.md ("Adding a backend") walks through it.
"""
