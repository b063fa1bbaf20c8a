"""Signed qualification attestations (issue 29): in-toto statements (a SLSA VSA and qualify's own predicate),
DSSE-signed, stored next to the image in cosign's layout, copied with promotions, verified without the database.

`statement` and `predicate` build, `signing` signs and verifies, `oci` stores and reads, `service` writes after
a decision and with a promotion, `check` answers `qualify verify` and `gate check --attestation`.
"""
