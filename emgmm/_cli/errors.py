"""The errors of the ``emgmm`` command line, by exit status.

:class:`CommandError` is a failure while running (status 1): a file missing,
unreadable or of the wrong content, an output that cannot be written.
:class:`UsageError` is a bad command line (status 2, argparse's status for its own
usage errors): options that contradict each other or the model they continue, an
output named like an input or another output, or with another format's suffix.
"""


class CommandError(Exception):
    """A failure detected by the command line itself while running: exit status 1."""


class UsageError(CommandError):
    """A bad combination of command-line options: reported by the subcommand's
    ``parser.error`` (its usage, then the message), exit status 2."""
