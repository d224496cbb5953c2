"""``python -m emgmm`` and the ``emgmm`` script: the command line.

:func:`run` imports the command line (numpy, scikit-learn: about a second) inside
the interrupt handling, so Ctrl-C during the imports exits with status 130 and one
line, as it does during a command.
"""

import sys


def run():
    """Import and run :func:`emgmm._cli.main`; exit with its status.

    Raises
    ------
    SystemExit
        Always: the command's status, 130 when interrupted (SIGINT) before the
        command started.
    """
    try:
        from ._cli import main
    except KeyboardInterrupt:
        print("emgmm: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())


if __name__ == "__main__":
    run()
