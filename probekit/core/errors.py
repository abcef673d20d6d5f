"""The one exception type users see: a single line saying what is wrong and what to do."""

MARK = "\u2060"
"""Around an option's name in a message (`probekit.core.options.named`, `given`): an invisible
word joiner, so that the message reads in Python's words as it is (`events`, `device='cuda:3'`)
and the command line's edge can write the flags instead (`probekit.core.options.as_flags`)."""


class ProbekitError(Exception):
    """A user-facing error. The CLI prints its message on one line (options named as flags) and
    exits with status 2; `str()` names them as Python keywords."""

    def __str__(self) -> str:
        return self.marked.replace(MARK, "")

    @property
    def marked(self) -> str:
        """The message with its options marked, for the command line to word as flags."""
        return super().__str__()


class StatisticsError(ProbekitError):
    """The scores hold too little for a statistic (too few units, a group or a pair missing, a
    constant matrix): what a partial run (`--limit`) meets, as distinct from a bad input or a
    failed write."""
