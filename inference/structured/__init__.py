"""Grammar-constrained decoding (llguidance): the request's grammar (`grammar.build_grammar`) and
the engine's per-request matchers and token masks (`runtime.GrammarRuntime`)."""

from inference.structured.grammar import GrammarError, build_grammar, response_schema

__all__ = ["GrammarError", "build_grammar", "response_schema"]
