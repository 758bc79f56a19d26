"""Errors that are the user's input, not a bug: reported as one line, exit code 2; a server that does
not answer: one line, exit code 75 (what such a line may show of a URL: rung.redaction.redact)."""


class InputError(ValueError):
    """Bad params, data or paths; the message names the key, file or field."""


class Unavailable(RuntimeError):
    """A server the stage needs did not answer in time; the message says what was kept and how to go on.
    Reported as one line with exit code 75 (EX_TEMPFAIL): a rerun once the server is back can succeed,
    so the pipeline's retries apply (an InputError's exit code 2 is never retried)."""

    exit_code = 75
