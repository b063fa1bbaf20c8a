"""`python -m qualify.workloads.train`: see qualify.workloads.train."""

import sys

from qualify.workloads.train.runner import main

if __name__ == "__main__":
    sys.exit(main())
