"""`python -m simfog ...`: the `simfog` command."""

import sys

from simfog.cli import main

if __name__ == "__main__":
    sys.exit(main())
