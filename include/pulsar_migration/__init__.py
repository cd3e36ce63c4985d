"""Move Apache Pulsar tenants between clusters: spec, admin client, positions and one package per step."""

__version__ = "0.1.0"
