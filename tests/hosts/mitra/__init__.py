"""Tests of :mod:`oretrofit.hosts.mitra`; they run in the Mitra environment (``make
test-mitra``), and ``tests/conftest.py`` leaves this directory out of a run over ``tests/``."""
