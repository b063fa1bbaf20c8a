"""Registry fixtures (filled in by the gate/promotion work)."""
