"""The README and the pages it links to stay true: links resolve, config keys exist, names are declared.

Reads README.md, CONTRIBUTING.md and docs/*.md as text (no Ray, no sweep):
- every relative link points at a file of the repository, and at a heading there when it names one
  (`docs/metrics.md#memory`), with GitHub's heading anchors;
- every config key the pages name — a dotted key in backticks (`measure.repeats`), or an override
  in a command or a backticked `key=value` (`ray.address=auto`, `+sweep=long_context`,
  `measure=thorough`) — exists in the schema's dataclasses, and every preset or sweep it selects
  exists; keys of `hydra.*` and `+testing.*` are Hydra's and the test seams', not the schema's;
- docs/metrics.md defines each metric and tag that `kvsweep.names` declares exactly once, and no
  other; docs/measurement.md's preset table holds what conf/measure/ and the schema give.
"""

import dataclasses
import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvsweep import names
from kvsweep.config.schema import KvSweepConfig, MeasureConfig
from kvsweep.results import STATUSES

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PRESETS = {p.stem for p in (ROOT / "conf" / "measure").glob("*.yaml")}
SWEEPS = {p.stem for p in (ROOT / "sweeps").glob("*.yaml")}
NOT_SCHEMA = ("hydra", "testing", "kvsweep")  # Hydra's own node, the test seams, MLflow tag names
GROUPS = {"measure": PRESETS, "sweep": SWEEPS}

FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
OVERRIDE = re.compile(r"(?<![\w.?&/$-])([+~]{0,2})([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)=(?!=)([^\s'\"`]*)")
SCRIPT = re.compile(r"(^|\s)scripts/\S+\.sh\b")  # a command that passes its overrides on to kvsweep
STARTS_AS_OVERRIDE = re.compile(r"^'?[+~]{0,2}[a-z][a-z0-9_.]*=")
DOTTED = re.compile(r"^[+~]{0,2}([a-z][a-z0-9_]*)((?:\.[a-z0-9_]+)+|\.\*)$")
FILE_NAME = re.compile(r"\.(html|md|py|png|json|jsonl|txt|yaml|csv|sh)$")
COMMAND_LANGS = {"", "bash", "sh", "shell", "console"}


@dataclasses.dataclass
class Page:
    """A Markdown page split the way a reader sees it: prose (code blocks blanked) and code blocks."""

    path: Path
    prose: str
    blocks: list[tuple[str, str]]  # (language, text)

    @classmethod
    def read(cls, path: Path) -> "Page":
        return cls.parse(path, path.read_text())

    @classmethod
    def parse(cls, path: Path, text: str) -> "Page":
        prose, blocks, fence, lang, body = [], [], None, "", []
        for line in text.splitlines():
            opened = FENCE.match(line)
            if fence is None and opened:
                fence, lang, body = opened.group(1), opened.group(2).lower(), []
                prose.append("")
            elif fence is not None and line.strip().startswith(fence):
                blocks.append((lang, "\n".join(body)))
                fence = None
                prose.append("")
            elif fence is not None:
                body.append(line)
                prose.append("")
            else:
                prose.append(line)
        return cls(path, "\n".join(prose), blocks)

    def headings(self) -> list[tuple[int, str]]:
        found = []
        for line in self.prose.splitlines():
            match = HEADING.match(line)
            if match:
                found.append((len(match.group(1)), match.group(2)))
        return found

    def anchors(self) -> set[str]:
        """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
        seen: dict[str, int] = {}
        anchors = set()
        for _, text in self.headings():
            text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
            slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
        return anchors

    def links(self) -> list[str]:
        outside_code = CODE_SPAN.sub("", self.prose)
        return [t for t in LINK.findall(outside_code) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]

    def code_spans(self) -> list[str]:
        return [m.group(2).strip() for m in CODE_SPAN.finditer(self.prose)]


def schema_keys(node: type = KvSweepConfig, prefix: str = "") -> tuple[set[str], set[str]]:
    """Every dotted key of the schema, and the keys that are maps (any sub-key is theirs to give)."""
    keys, maps = set(), set()
    for f in dataclasses.fields(node):
        key, hint = f"{prefix}{f.name}", typing.get_type_hints(node)[f.name]
        keys.add(key)
        if dataclasses.is_dataclass(hint):
            sub_keys, sub_maps = schema_keys(hint, f"{key}.")
            keys |= sub_keys
            maps |= sub_maps
        elif typing.get_origin(hint) is dict:
            maps.add(key)
    return keys, maps


KEYS, MAPS = schema_keys()
SECTIONS = {k for k in KEYS if any(other.startswith(f"{k}.") for other in KEYS)}


def broken_links(page: Page) -> list[str]:
    problems = []
    for target in page.links():
        file_part, _, anchor = target.partition("#")
        path = (page.path.parent / file_part).resolve() if file_part else page.path
        if not path.is_relative_to(ROOT) or not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md":
            target_page = Page.read(path) if file_part else page
            if anchor not in target_page.anchors():
                problems.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    return problems


def key_problem(key: str, value: str | None) -> str | None:
    """Why a key (and, for a config group, the option it selects) is not in the config; None if it is."""
    if key.split(".", 1)[0] in NOT_SCHEMA:
        return None
    if value is not None and key in GROUPS:
        options = [v for v in value.split("|") if v and not v.isupper()]  # NAME is a placeholder
        unknown = [v for v in options if v not in GROUPS[key]]
        return f"{key}={value}: no {key} named {', '.join(unknown)}" if unknown else None
    if key in KEYS or any(key.startswith(f"{m}.") for m in MAPS):
        return None
    return f"{key}: not a config key"


def named_keys(page: Page) -> list[tuple[str, str | None]]:
    """(key, value or None) for every config key the page names; see the module's docstring."""
    found: list[tuple[str, str | None]] = []

    def overrides(text: str) -> None:
        found.extend((m.group(2), m.group(3)) for m in OVERRIDE.finditer(text))

    for span in page.code_spans():
        if "python -m kvsweep" in span or STARTS_AS_OVERRIDE.match(span) or SCRIPT.search(span):
            overrides(span)
            continue
        dotted = DOTTED.match(span)
        if dotted and dotted.group(1) in SECTIONS and not FILE_NAME.search(span):
            key = span.lstrip("+~")
            found.append((key.removesuffix(".*"), None))
    for lang, text in page.blocks:
        if lang in COMMAND_LANGS:
            overrides("\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines()))
        elif lang == "yaml":
            found.extend((key, None) for key in yaml_keys(OmegaConf.to_container(OmegaConf.create(text))))
    return found


def yaml_keys(node: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in node.items():
        key = f"{prefix}{name}"
        if name == "defaults" and not prefix:
            continue
        keys.append(key)
        if isinstance(value, dict) and key not in MAPS:
            keys += yaml_keys(value, f"{key}.")
    return keys


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def table_rows(page: Page, header: str) -> list[list[str]]:
    """The body rows of every table whose header row starts with `| header |`, as lists of cells."""
    rows, inside = [], False
    for line in page.prose.splitlines():
        if line.startswith(f"| {header} |"):
            inside = True
        elif inside and line.startswith("|"):
            if not re.match(r"^\|\s*-", line):
                rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        else:
            inside = False
    return rows


def names_in(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- the pages


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_every_link_points_at_a_file_and_heading(path):
    assert broken_links(Page.read(path)) == []


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_every_config_key_named_exists(path):
    page = Page.read(path)
    problems = [p for key, value in named_keys(page) if (p := key_problem(key, value))]
    assert problems == []


def test_each_readme_section_links_to_its_detail_and_every_docs_page_is_linked():
    readme = Page.read(ROOT / "README.md")
    sections = re.split(r"^## ", readme.prose, flags=re.MULTILINE)[1:]
    without = [s.splitlines()[0] for s in sections if not Page(readme.path, s, []).links()]
    assert without == []
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in readme.links()}
    assert [page_id(p) for p in sorted((ROOT / "docs").glob("*.md")) if p not in linked] == []


def test_readme_quickstart_holds_the_run_and_the_test_command_first():
    """The convention the fresh-clone check reads: one Quickstart heading, then the two commands."""
    readme = Page.read(ROOT / "README.md")
    assert [t for _, t in readme.headings() if "quickstart" in t.lower()] == ["Quickstart"]
    after = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1]
    blocks = Page.parse(ROOT / "README.md", after).blocks
    assert blocks[0][1].strip().endswith("python -m kvsweep")
    assert blocks[1][1].strip().endswith("python -m pytest -q")


def defined_in_metrics_page(column: str) -> list[str]:
    """The names the first cell of each row of docs/metrics.md's `column` tables define."""
    page = Page.read(ROOT / "docs" / "metrics.md")
    return [n for row in table_rows(page, column) for n in names_in(row[0])]


def assert_each_defined_once(documented: list[str], declared: set[str]) -> None:
    assert sorted(n for n in set(documented) if documented.count(n) != 1) == [], "defined more than once"
    assert sorted(declared - set(documented)) == [], "declared in kvsweep.names, not defined in docs/metrics.md"
    assert sorted(set(documented) - declared) == [], "defined in docs/metrics.md, not declared in kvsweep.names"


def test_metrics_page_defines_every_declared_metric_once_and_nothing_else():
    declared = {*names.CELL_METRICS, *names.CELL_METRIC_PATTERNS, *(names.sweep_count_metric(s) for s in STATUSES)}
    declared |= set(names.COMPARE_METRICS)
    declared |= set(names.SWEEP_METRICS)
    assert_each_defined_once(defined_in_metrics_page("metric"), declared)


def test_metrics_page_defines_every_declared_tag_once_and_nothing_else():
    declared = {v for c in (names.ResultTag, names.RunTag) for k, v in vars(c).items() if k.isupper()}
    assert_each_defined_once(defined_in_metrics_page("tag"), declared)


def preset_values(name: str) -> dict[str, float]:
    """A preset as Hydra composes it: the schema's defaults, then the presets it extends, then its own keys."""
    values = {k: float(v) for k, v in dataclasses.asdict(MeasureConfig()).items()}
    own = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "measure" / f"{name}.yaml")) or {}
    for base in own.pop("defaults", []):
        if base != "_self_":
            values.update(preset_values(base))
    values.update({k: float(v) for k, v in own.items()})
    return values


def test_preset_table_holds_what_each_preset_file_gives():
    page = Page.read(ROOT / "docs" / "measurement.md")
    header = next(line for line in page.prose.splitlines() if line.startswith("| preset |"))
    columns = [c.strip() for c in header.strip().strip("|").split("|")][1:]
    table = {names_in(row[0])[0]: row[1:] for row in table_rows(page, "preset")}
    assert sorted(table) == sorted(PRESETS)
    for preset, cells in table.items():
        shown = {col: float(re.match(r"[\d.]+", cell).group()) for col, cell in zip(columns, cells, strict=True)}
        given = preset_values(preset)
        assert shown == {col: given[col] for col in columns}, preset


# -- the checks themselves fail on what they must catch


def test_checks_catch_a_broken_link_a_missing_heading_and_an_unknown_key():
    page = Page.parse(
        ROOT / "README.md",
        "# T\n\nSee [x](docs/no-such-page.md), [y](docs/metrics.md#no-such-heading), [z](#t), [w](#u).\n\n"
        "Set `measure.repeat` or run `python -m kvsweep ray.adress=auto measure=thorough`; "
        "`grid.caches` is fine, so are `+testing.runner=x` and `kvsweep.status`.\n\n"
        "```bash\npython -m kvsweep +sweep=no_such_sweep hydra.run.dir=out  # a comment: fake.key=1\n```\n",
    )
    assert broken_links(page) == [
        "docs/no-such-page.md: no such file",
        "docs/metrics.md#no-such-heading: no heading #no-such-heading in docs/metrics.md",
        "#u: no heading #u in README.md",
    ]
    problems = [p for key, value in named_keys(page) if (p := key_problem(key, value))]
    assert problems == [
        "measure.repeat: not a config key",
        "ray.adress: not a config key",
        "sweep=no_such_sweep: no sweep named no_such_sweep",
    ]


def test_anchors_follow_githubs_rule():
    page = Page.parse(ROOT / "x.md", "# The answer: selection table\n## `ray.*` keys\n## Notes\n## Notes\n")
    assert page.anchors() == {"the-answer-selection-table", "ray-keys", "notes", "notes-1"}


def test_the_readme_names_every_shipped_sweep_cache_and_model_preset():
    """The README's lists are complete and nothing in them is stale: its sweep table is the sweep files, its caches
    every registered strategy, its models every bundled preset (one added without a word fails here)."""
    from kvsweep.caches.registry import cache_names
    from kvsweep.models.presets import PRESETS as MODEL_PRESETS

    text = (ROOT / "README.md").read_text()
    assert set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE)) == SWEEPS
    named = set(re.findall(r"`([a-z0-9_.-]+)`", text))
    assert set(cache_names()) <= named, set(cache_names()) - named
    assert set(MODEL_PRESETS) <= named, set(MODEL_PRESETS) - named


def test_the_readme_is_the_two_commands_one_answer_and_links():
    """A README read in minutes: what it is, the two commands, one real answer, the cluster command, links;
    the detail lives in docs/ (at most 250 lines)."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
