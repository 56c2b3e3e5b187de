"""A stand-in for the Hugging Face Hub that serves repos saved in a local folder (`+testing.hub=FOLDER`).

`FOLDER/org/name/` is a repo (a tiny model saved with `save_pretrained`, and whatever else); a repo without one is
not on the Hub. `org/name.gated` makes it gated: only the token in that file may fetch it; `org/name.error` fails
every fetch with a network error quoting the token sent (as a careless proxy might), so a test can check kvsweep
never shows it. Fetched files land in a real Hub cache layout, so Transformers loads them offline as after a real
download. Every fetch is appended to `FOLDER/fetches.jsonl` with its times; `FOLDER/delay_s` slows each one.
"""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

FETCH_LOG = "fetches.jsonl"


def _refusal(kind: str, repo: str, status: int):  # the Hub's own exception classes, as huggingface_hub raises them
    import importlib

    from huggingface_hub import errors
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    http = importlib.import_module(errors.Response.__module__.split(".")[0])  # the HTTP client huggingface_hub uses
    url = f"https://huggingface.co/api/models/{repo}"
    response = http.Response(status, request=http.Request("GET", url))
    error = GatedRepoError if kind == "gated" else RepositoryNotFoundError
    return error(f"{status} Client Error for url {url} ({kind}, served by the test's stand-in Hub)", response=response)


class FolderHub:
    """The repos under `folder`, served into the Hub cache (see the module's docstring)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def files(self, repo: str, token: str | None) -> list[str]:
        return sorted(str(p.relative_to(self._repo(repo))) for p in self._repo(repo).rglob("*") if p.is_file())

    def fetch(self, repo: str, files: list[str], token: str | None, cache_dir: str | None) -> Path:
        root = self._repo(repo)
        gate = root.with_name(root.name + ".gated")
        if gate.exists() and token != gate.read_text().strip():
            raise _refusal("gated", repo, 403)
        if root.with_name(root.name + ".error").exists():
            raise ConnectionError(f"connection reset by proxy while sending 'Authorization: Bearer {token}'")
        started = time.time()
        delay = self.folder / "delay_s"
        time.sleep(float(delay.read_text()) if delay.exists() else 0.0)
        snapshot = self._write_cache(repo, root, files, cache_dir)
        with (self.folder / FETCH_LOG).open("a") as log:
            log.write(json.dumps({"repo": repo, "files": files, "started": started, "ended": time.time()}) + "\n")
        return snapshot

    def _repo(self, repo: str) -> Path:
        root = self.folder / repo
        if not root.is_dir():
            raise _refusal("missing", repo, 404)
        return root

    def _write_cache(self, repo: str, root: Path, files: list[str], cache_dir: str | None) -> Path:
        """The Hub cache's layout: content-addressed blobs, a snapshot of links to them, `refs/main`."""
        from huggingface_hub import constants

        cached = Path(cache_dir or constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
        listing = "\n".join(f"{f} {(root / f).stat().st_size}" for f in self.files(repo, None))
        commit = hashlib.sha1(listing.encode()).hexdigest()  # one commit per content of the repo
        snapshot = cached / "snapshots" / commit
        for name in files:
            blob = cached / "blobs" / hashlib.sha256((root / name).read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            if not blob.exists():
                shutil.copyfile(root / name, blob)
            link = snapshot / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():
                os.symlink(os.path.relpath(blob, link.parent), link)
        (cached / "refs").mkdir(parents=True, exist_ok=True)
        (cached / "refs" / "main").write_text(commit)
        snapshot.mkdir(parents=True, exist_ok=True)
        return snapshot
