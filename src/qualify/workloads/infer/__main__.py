"""`python -m qualify.workloads.infer`: see qualify.workloads.infer."""

import sys

from qualify.workloads.infer.runner import main

if __name__ == "__main__":
    sys.exit(main())
