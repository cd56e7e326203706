"""Errors the CLI turns into a one-line message and exit code 2 (bad input, never a traceback)."""


class UsageError(Exception):
    """Bad input: a wrong flag value, a missing or corrupt file, weights that do not fit."""
