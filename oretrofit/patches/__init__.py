"""Built-in host patch sets, one module per host.

Importing this package registers nothing: :func:`oretrofit.registered_hosts` imports the host
modules named in :data:`oretrofit._host.BUILTIN_HOSTS` on first use.
"""
