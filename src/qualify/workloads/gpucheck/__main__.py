"""`python -m qualify.workloads.gpucheck ...`: the GPU check's harness (see harness.py)."""

import sys

from qualify.workloads.gpucheck.harness import main

sys.exit(main())
