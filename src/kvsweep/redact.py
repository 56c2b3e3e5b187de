"""Keep secrets out of everything kvsweep prints or logs."""

import re
from urllib.parse import urlsplit, urlunsplit

_SECRET_PARAM = re.compile(r"(?i)((?:token|password|secret|key)=)[^&\s]+")


def redact_uri(uri: str) -> str:
    """`http://user:pass@host/x?token=t` -> `http://***@host/x?token=***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    query = _SECRET_PARAM.sub(r"\1***", parts.query)
    if "@" not in netloc and query == parts.query:
        return uri  # nothing secret (and urlunsplit would rewrite sqlite:////abs paths)
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_SECRET_ENV = re.compile(r"(?i)(token|secret|password|passwd|api_?key|access_?key|credential)")
_URI_CREDENTIALS = re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+@")
MIN_SECRET_CHARS = 6


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names say they are secrets (HF_TOKEN, AWS_SECRET_ACCESS_KEY...)."""
    import os

    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, environ: dict[str, str] | None = None) -> str:
    """Secrets from the environment and `user:pass@` in URIs, replaced by *** (messages, tracebacks)."""
    for value in secret_values(environ):
        text = text.replace(value, "***")
    return _URI_CREDENTIALS.sub("***@", text)
