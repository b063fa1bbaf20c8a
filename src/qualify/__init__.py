"""qualify: release qualification for ML container images."""
__version__ = "0.1.0"
