"""Errors that are the user's input, not a bug: reported as one line, exit code 2."""


class InputError(ValueError):
    """Bad params, data or paths; the message names the key, file or field."""
