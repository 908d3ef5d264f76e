"""Frontends: models in other formats -> ir.Graph."""
