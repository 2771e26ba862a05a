"""The front door's own answers, in OpenAI's error shape (HAProxy's defaults are HTML)."""

from __future__ import annotations

import json


def error(message: str, kind: str, code: str) -> str:
    """OpenAI's error body, as one HAProxy string argument (single-quoted, JSON inside: a quote
    in it is JSON's escape, as nothing escapes inside HAProxy's single quotes)."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return "'" + json.dumps(body, separators=(",", ":")).replace("'", "\\u0027") + "'"


UNAUTHORIZED = error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
TOO_MANY = error("Rate limit reached for this key.", "rate_limit_error", "rate_limit_exceeded")
UNAVAILABLE = error("The model is not serving now; try again.", "server_error", "unavailable")
# HAProxy's own errors, in OpenAI's shape too (its defaults are HTML): status -> body. (Not a
# request HAProxy cannot parse: HAProxy 2.6 answers that, and headers too slow, in HTML.)
ERRORS = {
    408: error("The request did not arrive in time.", "invalid_request_error", "request_timeout"),
    500: error("The front door failed this request.", "server_error", "internal_error"),
    502: error("The model server broke off its answer or gave none.", "server_error",
               "bad_gateway"),
    504: error("The model server did not answer in time.", "server_error", "gateway_timeout"),
}  # fmt: skip
