"""OpenAI-compatible HTTP server over the engine (`dayzero infer serve`)."""
