"""`python -m qualify.workloads.infer`: see qualify.workloads.infer."""

from qualify.workloads.protocol import exit_now
from qualify.workloads.infer.runner import main

if __name__ == "__main__":
    exit_now(main())
