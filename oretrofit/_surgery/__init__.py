"""How a model is patched, reverted, saved and calibrated: the host registry and its
:class:`~oretrofit.Host` protocol, composing a plan from the hosts' sites, the reversible
in-place class swap, patch specs on disk, and τ calibration.

May import :mod:`oretrofit._operators`, :mod:`oretrofit._kernels`, :mod:`oretrofit._files`; never a host (the built-in hosts are found by module name).
"""
