"""The structured-output schema corpus, llguidance over a byte vocabulary, and the conformance
checks the serving tests and `benchmarks.structured_outputs` share."""
