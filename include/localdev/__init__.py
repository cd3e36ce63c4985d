"""Local development environment: real Pulsar clusters, Airflow standalone, settings loader."""
