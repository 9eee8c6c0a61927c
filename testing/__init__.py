"""Utilities the tests and the benchmarks share: real services on free loopback ports (the Kafka
broker, the inference server, an OTLP receiver), scripted model servers, chaos and outage
harnesses, tools for tests, the published-to-transformers weight mappings and the structured-output
schema corpus. Imported from the repository root (`python -m pytest`, `python -m benchmarks.<name>`);
not part of the installed distribution."""
