"""API keys → tenants. Keys are stored hashed; the secret is printed once, at creation.

Key format: `dz_<id>_<secret>`; `id` (public, 12 hex chars) is the row's primary key, `secret` is
32 random bytes (urlsafe base64). Verification is one primary-key read and a constant-time
compare; verified keys are cached in-process for `CACHE_TTL_S` (a revocation takes at most that
long to bite in a running API process).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from orchestrator.clock import utcnow
from orchestrator.db.models import ApiKey

api_keys_t = ApiKey.__table__
KEY_PREFIX = "dz_"
CACHE_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class NewApiKey:
    id: str
    tenant: str
    key: str  # the full secret key; never stored


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_api_key(conn: Connection, tenant: str, name: str | None = None) -> NewApiKey:
    if not tenant or len(tenant) > 128:
        raise ValueError("tenant must be 1..128 characters")
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    conn.execute(
        insert(api_keys_t).values(
            id=key_id, tenant=tenant, key_hash=_hash(secret), name=name, created_at=utcnow()
        )
    )
    return NewApiKey(key_id, tenant, f"{KEY_PREFIX}{key_id}_{secret}")


def revoke_api_key(conn: Connection, key_id: str) -> bool:
    res = conn.execute(
        update(api_keys_t)
        .where(api_keys_t.c.id == key_id, api_keys_t.c.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return res.rowcount == 1


def list_api_keys(conn: Connection, tenant: str | None = None) -> list:
    q = select(
        api_keys_t.c.id,
        api_keys_t.c.tenant,
        api_keys_t.c.name,
        api_keys_t.c.created_at,
        api_keys_t.c.revoked_at,
    ).order_by(api_keys_t.c.created_at)
    if tenant is not None:
        q = q.where(api_keys_t.c.tenant == tenant)
    return list(conn.execute(q))


def _split(key: str) -> tuple[str, str] | None:
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("_")
    if not sep or not key_id or not secret or len(key_id) > 16:
        return None
    return key_id, secret


def lookup_tenant(conn: Connection, key: str) -> str | None:
    """The tenant of a valid, unrevoked key, else None."""
    parts = _split(key)
    if parts is None:
        return None
    key_id, secret = parts
    row = conn.execute(
        select(api_keys_t.c.tenant, api_keys_t.c.key_hash, api_keys_t.c.revoked_at).where(
            api_keys_t.c.id == key_id
        )
    ).first()
    if row is None or row.revoked_at is not None:
        return None
    return row.tenant if hmac.compare_digest(row.key_hash, _hash(secret)) else None


def known_tenants(conn: Connection) -> set[str]:
    """Tenants holding at least one unrevoked key (Kafka ingest accepts only these)."""
    rows = conn.execute(select(api_keys_t.c.tenant).where(api_keys_t.c.revoked_at.is_(None)).distinct())
    return {r.tenant for r in rows}


class KeyCache:
    """Verified key → tenant, for a short TTL. Negative results are not cached."""

    def __init__(self, engine: Engine, ttl_s: float = CACHE_TTL_S):
        self.engine = engine
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, float]] = {}

    def cached(self, key: str) -> str | None:
        """The tenant if this key was verified within the TTL; no I/O."""
        with self._lock:
            hit = self._entries.get(_hash(key))
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    def tenant_for(self, key: str) -> str | None:
        digest = _hash(key)
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        with self.engine.connect() as conn:
            tenant = lookup_tenant(conn, key)
        if tenant is not None:
            with self._lock:
                if len(self._entries) > 10_000:
                    self._entries.clear()
                self._entries[digest] = (tenant, now + self.ttl_s)
        return tenant
