"""The REST ingress: `create_app()` builds the FastAPI application."""

from orchestrator.api.app import create_app

__all__ = ["create_app"]
