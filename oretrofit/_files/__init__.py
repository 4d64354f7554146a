"""What oretrofit reads and writes: the bounded reader (a regular file within its kind's cap),
atomic writes that never follow a symbolic link, run provenance, JSON with non-finite numbers
by name, and markdown tables.

Imports nothing of oretrofit outside this package.
"""
