"""This project's Airflow integration: the provider info (the Pulsar connection type), its hook, and the logic
behind the "Pulsar migrations" UI plugin (plugins/pulsar_migrations.py)."""
