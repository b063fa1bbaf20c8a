"""Process exit codes shared by every command (CI jobs branch on them)."""

OK = 0  # success, or verdict PASS
FAIL = 1  # verdict FAIL, or a digest without a PASS decision
BAD_INPUT = 2  # a manifest, argument or reference is wrong
INFRA = 3  # database, registry, Ray or executor could not do its part
