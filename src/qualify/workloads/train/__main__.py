"""`python -m qualify.workloads.train`: see qualify.workloads.train."""

from qualify.workloads.protocol import exit_now
from qualify.workloads.train.runner import main

if __name__ == "__main__":
    exit_now(main())
