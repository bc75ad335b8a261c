"""``python -m detector <command>``: the commands live in :mod:`detector.cli`."""

from detector.cli import run

if __name__ == "__main__":
    run()
