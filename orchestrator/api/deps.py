"""Request dependencies as `Annotated` aliases: the engine, settings, and the caller's tenant.

Handlers open their own `with engine.begin()` unit of work, so a write is committed before the
response is sent (a yield-dependency would commit after the status is already decided)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine

from orchestrator.api.errors import ProblemError
from orchestrator.auth import KeyCache
from orchestrator.config import IngressSettings, Settings

_bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer dz_…`")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="API key, alternatively")


# `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool, one thread
# hop per dependency per request; these never block (the key lookup goes to a thread on a miss).
async def _engine(request: Request) -> Engine:
    return request.app.state.engine


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _ingress(request: Request) -> IngressSettings:
    return request.app.state.ingress


async def _tenant(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    header_key: Annotated[str | None, Security(_header)],
) -> str:
    key = bearer.credentials if bearer is not None else header_key
    if not key:
        raise ProblemError(401, "Unauthorized", "an API key is required", type_="unauthenticated")
    cache: KeyCache = request.app.state.key_cache
    tenant = cache.cached(key)
    if tenant is None:
        tenant = await anyio.to_thread.run_sync(cache.tenant_for, key)
    if tenant is None:
        raise ProblemError(401, "Unauthorized", "invalid or revoked API key", type_="unauthenticated")
    request.state.api_key = key  # long-lived responses (event streams) check it again later
    return tenant


DbDep = Annotated[Engine, Depends(_engine)]
SettingsDep = Annotated[Settings, Depends(_settings)]
IngressDep = Annotated[IngressSettings, Depends(_ingress)]
TenantDep = Annotated[str, Depends(_tenant)]
