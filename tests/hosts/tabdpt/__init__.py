"""Tests of :mod:`oretrofit.hosts.tabdpt`; they run in the tabdpt environment (``make
test-tabdpt``), and ``tests/conftest.py`` leaves this directory out of a run over ``tests/``."""
