"""CLI command modules, one per command group."""
