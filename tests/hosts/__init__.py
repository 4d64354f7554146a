"""Tests of :mod:`oretrofit.hosts`, one folder per host. pytest puts ``tests/`` on ``sys.path``,
so other tests read the architecture list as ``from hosts.transformers import zoo``."""
