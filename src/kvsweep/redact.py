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
