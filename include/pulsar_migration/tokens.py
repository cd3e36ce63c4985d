"""What a cluster token says about its own lifetime. Pulsar's token authentication takes JWTs; their `exp`
claim is readable without the key. The tools never verify a token (the broker does): they only read when it
stops working, to warn before a long run outlives it and to name the expiry when the broker refuses it.

A token can also live in a file that something else keeps fresh (a secrets agent, a projected service-account
token): `read_file` reads it at each use, so a run outlives any one token the file held."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A run that may outlive its token gets a warning when the token has less than this left at its start.
EXPIRY_WARNING = datetime.timedelta(hours=1)


def expiry(token: str | None) -> datetime.datetime | None:
    """The token's `exp` as an aware UTC time; None for no token, a token that is no JWT, or one without `exp`."""
    if not token or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims.get("exp") if isinstance(claims, dict) else None
        if isinstance(exp, bool) or not isinstance(exp, (int, float)):
            return None
        return datetime.datetime.fromtimestamp(exp, datetime.UTC)
    except (binascii.Error, ValueError, UnicodeDecodeError, OverflowError, OSError):
        return None


# The ways a cluster entry (spec, Airflow connection, lookup service) names its credential: at most one of them.
CREDENTIAL_KEYS = ("token_env", "token_file", "oauth2")


def credentials_given(entry: Mapping[str, Any]) -> list[str]:
    """The CREDENTIAL_KEYS an entry sets, in that order (more than one is a contradiction its reader refuses)."""
    return [key for key in CREDENTIAL_KEYS if entry.get(key)]


class TokenFileError(ValueError):
    """A token file that is missing, unreadable or empty (the message names what, never a token)."""


def read_file(path: str, attempts: int = 3) -> str:
    """The token a file holds now, surrounding whitespace dropped (as Pulsar's Java client reads `file:` tokens).
    An empty read is tried again briefly: an agent that rewrites the file in place leaves it empty for a moment."""
    for attempt in range(attempts):
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except FileNotFoundError as exc:
            raise TokenFileError(f"file {path} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenFileError(f"file {path} is not readable ({type(exc).__name__})") from exc
        if token:
            return token
        if attempt + 1 < attempts:
            time.sleep(0.1)
    raise TokenFileError(f"file {path} is empty")


def expired_note(exp: datetime.datetime | None, now: datetime.datetime | None = None) -> str | None:
    """`expired at <time>` when `exp` (a token's expiry) has passed, else None: what a refusal then means."""
    now = now or datetime.datetime.now(datetime.UTC)
    if exp is None or exp > now:
        return None
    return f"expired at {_iso(exp)}"


def lifetime_warning(exp: datetime.datetime | None, who: str, now: datetime.datetime | None = None,
                     renewable: bool = False) -> str | None:
    """One line when a token expiring at `exp` stops working within EXPIRY_WARNING of `now`, else None.
    `renewable`: the token comes from a file, read again when the cluster refuses it."""
    now = now or datetime.datetime.now(datetime.UTC)
    if exp is None or exp - now > EXPIRY_WARNING or exp <= now:
        return None
    minutes = (exp - now).total_seconds() / 60
    if renewable:
        return (f"{who} expires at {_iso(exp)}, in {minutes:.0f} min: the file is read again when the cluster "
                "refuses it, so a run still going then needs a fresh token in the file by then")
    return (f"{who} expires at {_iso(exp)}, in {minutes:.0f} min: a run still going then stops when the cluster "
            "refuses it; a re-run with a fresh token resumes")


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
