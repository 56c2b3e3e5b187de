"""Where a node fetches Hub repos from: the Hugging Face Hub itself, or the test seam's stand-in.

The fetch code reaches a repo only through a source: its file list, and some of its files in the Hub cache.
So `+testing.hub=FOLDER` can serve repos saved in a folder, with no network.
"""

import glob
from pathlib import Path
from typing import Protocol


class HubSource(Protocol):
    """Where a node fetches repos from: the Hub (`HfHubSource`), or a test's stand-in (`testing/fake_hub.py`)."""

    def files(self, repo: str, token: str | None) -> list[str]:
        """Every file's path in the repo's main revision."""
        ...

    def fetch(self, repo: str, files: list[str], token: str | None, cache_dir: str | None) -> Path:
        """`files` of the main revision in the Hub cache under `cache_dir` (None: the default); the snapshot folder."""
        ...


class HfHubSource:
    """The Hugging Face Hub, through huggingface_hub (parallel downloads, resumed, into its cache layout)."""

    def files(self, repo: str, token: str | None) -> list[str]:
        from huggingface_hub import HfApi

        info = HfApi().model_info(repo, token=token)
        return [sibling.rfilename for sibling in info.siblings or []]

    def fetch(self, repo: str, files: list[str], token: str | None, cache_dir: str | None) -> Path:
        from huggingface_hub import snapshot_download

        patterns = [glob.escape(f) for f in files]  # exact names: `[` in a name is not a pattern
        return Path(snapshot_download(repo, allow_patterns=patterns, token=token, cache_dir=cache_dir))


def source_for(folder: str) -> HubSource:
    """The Hub, or with the `+testing.hub=FOLDER` seam, a stand-in serving the repos saved under FOLDER."""
    if not folder:
        return HfHubSource()
    from kvsweep.testing.fake_hub import FolderHub

    return FolderHub(folder)
