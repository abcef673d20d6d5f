"""The one exception type users see: a single line saying what is wrong and what to do."""


class ProbekitError(Exception):
    """A user-facing error. The CLI prints its message on one line and exits with status 2."""
