"""The ``oretrofit`` command line (typer); each verb lives in its own module."""
