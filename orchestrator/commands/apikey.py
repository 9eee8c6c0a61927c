"""`dayzero apikey create|list|revoke`: API keys (stored hashed) that map callers to tenants."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("apikey", help="manage API keys")
    ks = p.add_subparsers(dest="apikey_command", required=True)
    c = ks.add_parser("create", help="create a key for a tenant and print it (shown only this once)")
    c.add_argument("--tenant", required=True, help="the tenant whose tasks the key may see and create")
    c.add_argument("--name", default=None, help="a label for the key")
    c.set_defaults(func=_create)
    ls = ks.add_parser("list", help="list keys (ids only, never secrets)")
    ls.add_argument("--tenant", default=None, help="only this tenant's keys (default: every tenant)")
    ls.set_defaults(func=_list)
    r = ks.add_parser("revoke", help="revoke a key by id")
    r.add_argument("key_id", help="the key's id, as `dayzero apikey list` prints it")
    r.set_defaults(func=_revoke)


def _engine():  # type: ignore[no-untyped-def]
    from orchestrator.app import make_db
    from orchestrator.config import Settings

    return make_db(Settings())


def _create(args: argparse.Namespace) -> int:
    import sys

    from orchestrator.auth import create_api_key

    with _engine().begin() as conn:
        key = create_api_key(conn, args.tenant, args.name)
    print(key.key)
    print(f"key id {key.id} for tenant {key.tenant}; store it now, it is not shown again", file=sys.stderr)
    return 0


def _list(args: argparse.Namespace) -> int:
    from orchestrator.auth import list_api_keys

    with _engine().connect() as conn:
        for k in list_api_keys(conn, args.tenant):
            state = f"revoked {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "active"
            print(f"{k.id}\t{k.tenant}\t{k.name or ''}\t{k.created_at:%Y-%m-%d %H:%M}\t{state}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from orchestrator.auth import revoke_api_key

    with _engine().begin() as conn:
        ok = revoke_api_key(conn, args.key_id)
    print("revoked" if ok else "no such active key")
    return 0 if ok else 1
