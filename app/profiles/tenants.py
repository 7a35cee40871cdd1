"""Tenants: each API key is one, named by a short hash of the key; with no key, one anonymous tenant.

A profile's keys come from `server.api_key`, `server.api_keys` and `server.api_key_file` (one key
per line; blank lines and `#` comments skipped). `server.api_key` is also the server key: the
admin routes (POST /admin/reload) take it and no tenant's key of the other two. The file is
checked when the profile is resolved (the loader's check_api_keys) and read into the HTTP app's
`Tenants` at startup and on each reload, so editing it and reloading rotates keys. The tenant id
is what the rest of the server knows a client by (the prompt cache's partition, whose rows
/slots shows in full, the access event's `tenant`): never the key itself, and stable across
restarts and reloads. Its 48 bits of SHA-256 give away nothing usable of a long random key (as
keys should be); a short guessable key could be guessed from its id offline.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from app.profiles.schema import ServerSettings

ANONYMOUS = "anonymous"  # the one tenant of a server without keys
TENANT_ID_HEX = 12


def tenant_id(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:TENANT_ID_HEX]


def read_key_file(path: str) -> list[str]:
    """The keys of a key file (OSError or UnicodeDecodeError when it cannot be read as text)."""
    lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def configured_keys(server: ServerSettings) -> list[str]:
    """Every key the settings name, from all three places."""
    keys = [server.api_key] if server.api_key is not None else []
    keys += server.api_keys
    if server.api_key_file is not None:
        keys += read_key_file(server.api_key_file)
    return keys


@dataclass(frozen=True)
class Tenants:
    keys: tuple[tuple[bytes, str], ...]  # (key, its tenant id)
    server: str | None = None  # the tenant of `server.api_key`, the server key: the admin routes are its alone

    @classmethod
    def of(cls, server: ServerSettings) -> Tenants:
        keys = tuple((key.encode(), tenant_id(key)) for key in configured_keys(server))
        return cls(keys, None if server.api_key is None else tenant_id(server.api_key))

    @property
    def open(self) -> bool:
        """No key configured: every request is the anonymous tenant's."""
        return not self.keys

    def identify(self, presented: str) -> str | None:
        """The tenant whose key this is, or None. Every key is compared, in constant time each,
        so how long it takes says nothing of which key (or how much of one) matched."""
        found = None
        for key, tenant in self.keys:
            if hmac.compare_digest(presented.encode(), key):
                found = tenant
        return found
