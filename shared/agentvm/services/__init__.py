"""Use cases. Services know only ports; adapters are chosen by a composition root."""
