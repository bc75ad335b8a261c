"""``python -m detector <command>``: the commands live in :mod:`detector.cli`."""

import sys

from detector.cli import main

if __name__ == "__main__":
    sys.exit(main())
