"""The release gate: statistics (noninferiority, stats, sequential, duet_stats, agreement, calibration), the
checks (reasons, checks, regression_checks, quality_checks), the pure verdict (evaluate), the database glue
(judging, standing) and the push check (push_check).

Nothing is imported here: `qualify gate check` loads the push check and the standing only, not the checks and
their statistics (scipy).
"""
