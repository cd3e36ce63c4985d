"""Admin error reasons never carry a token, whatever a proxy echoes back."""

from __future__ import annotations

import requests
from pulsar_migration.admin import _reason


def _response(body: bytes, status: int = 502) -> requests.Response:
    resp = requests.Response()
    resp.status_code, resp._content, resp.reason = status, body, "Bad Gateway"
    return resp


def test_token_like_text_is_masked_in_error_reasons() -> None:
    reason = _reason(_response(b'<html>{"authenticationParameters":"token:eyJ.abc-1"} Bearer eyJ.xyz</html>'))
    assert "eyJ" not in reason
    assert "token:***" in reason or '"authenticationParameters":"***"' in reason
    assert "Bearer ***" in reason


def test_broker_reasons_pass_through() -> None:
    assert _reason(_response(b'{"reason": "Tenant does not exist"}', 404)) == "Tenant does not exist"
