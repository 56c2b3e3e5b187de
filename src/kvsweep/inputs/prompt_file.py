"""The user's prompts (`inputs.path`), read and checked in the driver before anything starts.

A mistake in a file of hundreds of prompts is found here, once, with its line number, instead of in
every cell after Ray has started. Two formats: `.jsonl`, one JSON object a line (`prompt` or chat
`messages`, optionally `answer`), and `.txt`, one prompt per blank-line-separated block. The cells get
the records as read (`InputSpec.records`); the file's hash makes a changed file a new cell.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsweep.errors import ConfigError, first_line

KEY = "inputs.path"
JSONL, TXT = ".jsonl", ".txt"
PROMPT, MESSAGES, ANSWER = "prompt", "messages", "answer"
RECORD_KEYS = (PROMPT, MESSAGES, ANSWER)
MESSAGE_KEYS = ("role", "content")
LAST_ROLE = "user"  # the model answers the last turn, so it must be the user's


class _JsonNumber(str):
    """A number as the file writes it: `"answer": 0.10` is the text `0.10`, not the float 0.1's `0.1`."""


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, _JsonNumber)


@dataclass(frozen=True)
class PromptFile:
    name: str  # the file's name, as the cells' `inputs` param shows it (`file:<name>`)
    sha256: str  # of the file's bytes
    records: tuple[dict[str, Any], ...]  # {"prompt": str} or {"messages": [...]}, "answer"?, "line"


def read_prompt_file(path: str, key: str = KEY) -> PromptFile:
    """The file's prompts; any mistake is a `ConfigError` of one line naming `key` (the setting that gave the
    file: `inputs.path` or `workload.path`), the file (as given) and the fault."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"{key}: {path} does not exist (a relative path is read from {Path.cwd()})")
    if file.is_dir():
        raise ConfigError(f"{key}: {path} is a folder; expected a {JSONL} or {TXT} file")
    if file.suffix.lower() not in (JSONL, TXT):
        raise ConfigError(f"{key}: {path}: expected a {JSONL} or {TXT} file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: {path} cannot be read: {first_line(exc)}") from None
    text = _decode(data, path, key)
    records = _jsonl_records(text, path, key) if file.suffix.lower() == JSONL else _txt_records(text)
    if not records:
        what = "the file is empty" if not data else "only blank lines"
        raise ConfigError(f"{key}: {path} has no prompts ({what})")
    return PromptFile(file.name, hashlib.sha256(data).hexdigest(), tuple(records))


def _decode(data: bytes, path: str, key: str) -> str:
    try:
        return data.decode("utf-8-sig")  # a byte-order mark some editors write is not part of the first prompt
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{key}: {path} line {line} is not UTF-8 text (byte {exc.start})") from None


def _lines(text: str) -> list[str]:
    """Split on newlines only: `str.splitlines` would also cut at characters a JSON string may hold."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _txt_records(text: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    block: list[str] = []
    for number, line in enumerate([*_lines(text), ""], 1):
        if line.strip():
            block.append(line)
            continue
        if block:
            records.append({PROMPT: "\n".join(block), "line": number - len(block)})
            block = []
    return records


def _jsonl_records(text: str, path: str, key: str) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        where = f"{key}: {path} line {number}"
        try:
            value = json.loads(line, parse_int=_JsonNumber, parse_float=_JsonNumber, parse_constant=_JsonNumber)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where} is not JSON: {exc.msg} (column {exc.colno})") from None
        records.append({**_record(value, where), "line": number})
    return records


def _record(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f'{where} is a JSON {_kind(value)}, not an object such as {{"{PROMPT}": "..."}}')
    unknown = [key for key in value if key not in RECORD_KEYS]
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        raise ConfigError(
            f"{where} has unknown key{'s' * (len(unknown) > 1)} {names}; allowed: {', '.join(RECORD_KEYS)}"
        )
    if PROMPT in value and MESSAGES in value:
        raise ConfigError(f"{where} has both '{PROMPT}' and '{MESSAGES}'; give one of them")
    if PROMPT in value:
        record: dict[str, Any] = {PROMPT: _prompt(value[PROMPT], where)}
    elif MESSAGES in value:
        record = {MESSAGES: _messages(value[MESSAGES], where)}
    else:
        raise ConfigError(f"{where} has neither '{PROMPT}' nor '{MESSAGES}'; each line needs one of them")
    if ANSWER in value:
        record[ANSWER] = _answer(value[ANSWER], where)
    return record


def _prompt(value: Any, where: str) -> str:
    if not _is_text(value):
        raise ConfigError(f"{where}: '{PROMPT}' must be a string, got a JSON {_kind(value)}")
    if not value.strip():
        raise ConfigError(f"{where}: '{PROMPT}' is empty")
    return value


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else f"a JSON {_kind(value)}"
        raise ConfigError(f"{where}: '{MESSAGES}' must be a non-empty list of {{role, content}} turns, got {got}")
    turns = []
    for index, turn in enumerate(value):
        at = f"{where}: {MESSAGES}[{index}]"
        if not isinstance(turn, dict):
            raise ConfigError(f"{at} is a JSON {_kind(turn)}, not an object with 'role' and 'content'")
        if sorted(turn) != sorted(MESSAGE_KEYS):
            keys = ", ".join(repr(key) for key in turn) or "none"
            raise ConfigError(f"{at} must have exactly the keys 'role' and 'content'; it has {keys}")
        for key in MESSAGE_KEYS:
            if not _is_text(turn[key]):
                raise ConfigError(f"{at}: '{key}' must be a string, got a JSON {_kind(turn[key])}")
        if not turn["role"].strip():
            raise ConfigError(f"{at}: 'role' is empty")
        turns.append({"role": turn["role"], "content": turn["content"]})
    last = turns[-1]
    if last["role"] != LAST_ROLE:
        raise ConfigError(
            f"{where}: the last of '{MESSAGES}' is a {last['role']!r} turn; it must be the {LAST_ROLE!r} turn to answer"
        )
    if not last["content"].strip():
        raise ConfigError(f"{where}: the last '{LAST_ROLE}' turn of '{MESSAGES}' is empty")
    return turns


def _answer(value: Any, where: str) -> str:
    """Numbers are answers too (`"answer": 42`): compared as the text they are written as."""
    if not isinstance(value, str):
        raise ConfigError(f"{where}: '{ANSWER}' must be a string or a number, got a JSON {_kind(value)}")
    answer = str(value)  # a plain str, also for a number
    if not answer.strip():
        raise ConfigError(f"{where}: '{ANSWER}' is empty; leave the key out for a prompt without an answer")
    return answer


def _kind(value: Any) -> str:
    """A value's JSON type, in the words the file's author used."""
    if value is None:
        return "null"
    kinds = {_JsonNumber: "number", bool: "boolean", str: "string", list: "list", dict: "object"}
    return kinds.get(type(value), type(value).__name__)
