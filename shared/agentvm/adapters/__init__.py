"""Adapters implementing the ports: `local` (embedded) and `aws` (cloud)."""
