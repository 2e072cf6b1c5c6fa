"""Secrets in the URLs the settings hold (a database's or Redis's password, an alert
service's key), masked wherever a URL is shown: `config show`, errors, logs, doctor."""

# Secrets sit in a URL's userinfo (postgresql://u:pw@host, redis://:pw@host,
# https://key@host) or in its query (libpq's ?password=, ?auth=, ?token=...). The
# database's and Redis's user name is kept (it says which account); any other
# userinfo is taken for a key. Query parameters whose name looks like a secret are
# masked, the others kept as written.

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
NOT_A_URL = "(set, not shown: not a URL)"
SECRET_NAME = re.compile(
    r"pass|pwd|secret|token|auth|key|sig|credential|session|cookie|private", re.IGNORECASE
)
_NAMED_USER = ("postgres", "postgresql", "redis", "rediss", "unix", "sqlite")


def url(text: str) -> str:
    """``text`` as it may be shown: its password, keys and secret parameters masked."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return NOT_A_URL
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if parts.scheme.lower() in _NAMED_USER:
            userinfo = f"{user}:{MASK}" if colon else user
        else:
            userinfo = MASK
        netloc = f"{userinfo}@{host}"
    query = "&".join(_masked_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    if (netloc, query) == (parts.netloc, parts.query):
        return text  # as written (urlunsplit would shorten sqlite:///path)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _masked_pair(pair: str) -> str:
    name, equals, value = pair.partition("=")
    if equals and value and SECRET_NAME.search(unquote(name)):
        return f"{name}={MASK}"
    return pair


def scrub(text: str, *urls: str) -> str:
    """``text`` (an error message, a log line) with each of ``urls`` in it masked, and any
    of their secrets that appear on their own."""
    for raw in urls:
        if not raw:
            continue
        text = text.replace(raw, url(raw))
        for secret in secrets_of(raw):
            text = text.replace(secret, MASK)
    return text


def secrets_of(text: str) -> list[str]:
    """The secret values ``text`` (a URL) holds, as written and decoded, longest first."""
    try:
        parts = urlsplit(text)
    except ValueError:
        return []
    found: list[str] = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        _, colon, password = userinfo.partition(":")
        if colon:
            found.append(password)
        if parts.scheme.lower() not in _NAMED_USER:
            found.append(userinfo)
    for pair in parts.query.split("&"):
        name, equals, value = pair.partition("=")
        if equals and value and SECRET_NAME.search(unquote(name)):
            found.append(value)
    found += [unquote(value) for value in found]
    return sorted({value for value in found if len(value) >= 3}, key=len, reverse=True)


def pg_password(text: str) -> tuple[str, str | None]:
    """A PostgreSQL URL without its password (in the userinfo or libpq's ``password``
    parameter) and that password, for PGPASSWORD: a child process's command line is
    readable by every account (ps)."""
    parts = urlsplit(text)
    password: str | None = None
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, written = userinfo.partition(":")
        if colon:
            password = unquote(written)
            netloc = f"{user}@{host}"
    kept = []
    for pair in parts.query.split("&") if parts.query else []:
        name, _, value = pair.partition("=")
        if unquote(name) == "password":
            password = unquote(value)  # libpq: the parameter wins over the userinfo
        else:
            kept.append(pair)
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(kept))), password
