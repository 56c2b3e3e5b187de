"""Keep secrets out of everything kvsweep prints, writes to disk or logs to MLflow.

Output folders get copied, shared and attached to tickets, so nothing written may hold a credential: URIs lose
their `user:password@` / `token@` part and secret query parameters, and secret-looking environment variables'
values and anything shaped like a Hugging Face token (`hf_` and 30+ letters and digits) are replaced wherever they
appear (a node's own token file, an error message quoting the header it sent).
"""

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
# A query parameter named like a secret (`token=`, `access_token=`, `X-Amz-Signature=`, `api_key=`), but not
# one that merely ends in those letters (`viewStateShareKey=` in MLflow's links).
_SECRET_PARAM = re.compile(
    r"(?i)((?:^|(?<=[?&]))[^=&?]*(?<![a-z0-9])(?:api_?key|apikey|token|password|passwd|secret|key|sig|signature)=)"
    r"[^&#\s]+"
)
_URI_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{},]+")
_CREDENTIALS_IN_TEXT = re.compile(r"(?<=://)[^/\s?#]*@")  # up to the last @ before the path: `user:p@ss@`


def redact_uri(uri: str) -> str:
    """`http://user:pass@host/x?token=t` -> `http://***@host/x?token=***`."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    query = _SECRET_PARAM.sub(rf"\1{MASK}", parts.query)
    if "@" not in netloc and query == parts.query:
        return uri  # nothing secret (and urlunsplit would rewrite sqlite:////abs paths)
    if "@" in netloc:
        netloc = f"{MASK}@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def is_redacted(uri: str) -> bool:
    """A URI kvsweep wrote with its credentials taken out: unusable as it is."""
    return MASK in uri


def without_credentials(uri: str) -> str:
    """`http://***@host:5000` -> `http://host:5000`: the address, for credentials that come from elsewhere."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, parts.query, parts.fragment))


# A Hugging Face user access token: `hf_` then (today) 34 letters and digits; not part of a longer name.
_HF_TOKEN = re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9_])")
_SECRET_ENV = re.compile(r"(?i)(token|secret|password|passwd|api_?key|access_?key|credential)")
MIN_SECRET_CHARS = 6


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names say they are secrets (HF_TOKEN, AWS_SECRET_ACCESS_KEY...)."""
    import os

    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if _SECRET_ENV.search(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, environ: dict[str, str] | None = None) -> str:
    """Secrets from the environment and credentials in every URI, replaced by *** (messages, files, tags)."""
    for value in secret_values(environ):
        text = text.replace(value, MASK)
    text = _HF_TOKEN.sub(MASK, text)
    text = _CREDENTIALS_IN_TEXT.sub(f"{MASK}@", text)
    return _URI_IN_TEXT.sub(lambda match: _SECRET_PARAM.sub(rf"\1{MASK}", match.group(0)), text)
