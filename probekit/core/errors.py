"""The one exception type users see: a single line saying what is wrong and what to do."""


class ProbekitError(Exception):
    """A user-facing error. The CLI prints its message on one line and exits with status 2."""


class StatisticsError(ProbekitError):
    """The scores hold too little for a statistic (too few units, a group or a pair missing, a
    constant matrix): what a partial run (`--limit`) meets, as distinct from a bad input or a
    failed write."""
