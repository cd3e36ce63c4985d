"""What a cluster token says about its own lifetime. Pulsar's token authentication takes JWTs; their `exp`
claim is readable without the key. The tools never verify a token (the broker does): they only read when it
stops working, to warn before a long run outlives it and to name the expiry when the broker refuses it."""

from __future__ import annotations

import base64
import binascii
import datetime
import json

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


def expired_note(exp: datetime.datetime | None, now: datetime.datetime | None = None) -> str | None:
    """`expired at <time>` when `exp` (a token's expiry) has passed, else None: what a refusal then means."""
    now = now or datetime.datetime.now(datetime.UTC)
    if exp is None or exp > now:
        return None
    return f"expired at {_iso(exp)}"


def lifetime_warning(exp: datetime.datetime | None, who: str, now: datetime.datetime | None = None) -> str | None:
    """One line when a token expiring at `exp` stops working within EXPIRY_WARNING of `now`, else None."""
    now = now or datetime.datetime.now(datetime.UTC)
    if exp is None or exp - now > EXPIRY_WARNING or exp <= now:
        return None
    minutes = (exp - now).total_seconds() / 60
    return (f"{who} expires at {_iso(exp)}, in {minutes:.0f} min: a run still going then stops when the cluster "
            "refuses it; a re-run with a fresh token resumes")


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
