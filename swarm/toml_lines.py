"""Where a key sits in TOML text, so a config error can name its line."""

from __future__ import annotations

import re


def locate(text: str, message: str) -> str:
    """', line N' for the key a msgspec error is about, or '' if not found."""
    at = re.search(r"at `\$((?:\.[A-Za-z_][\w-]*|\[\d+\])*)`", message)
    path: list[str | int] = []
    if at:
        for name, index in re.findall(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]", at.group(1)):
            path.append(name if name else int(index))
    key = re.search(r"(?:unknown|missing required) field `([^`]+)`", message)
    if key and "unknown" in message:
        path.append(key.group(1))
    return line_suffix(text, path)


def line_suffix(text: str, path: list[str | int]) -> str:
    line = find_line(text, path)
    return f", line {line}" if line else ""


def find_line(text: str, path: list[str | int]) -> int | None:
    """The 1-based line of a key in TOML text, e.g. ["agents", 1, "name"]: the
    `name = ` line after the second `[[agents]]` header. Best effort."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    i = 0
    while i < len(path):
        part = path[i]
        nxt = path[i + 1] if i + 1 < len(path) else None
        if isinstance(part, str) and isinstance(nxt, int):
            # An array of tables: the nxt-th [[part]] header, up to the next header.
            headers = [n for n in range(start, end) if re.match(rf"\s*\[\[\s*{re.escape(part)}\s*\]\]", lines[n])]
            if nxt < len(headers):
                start = headers[nxt]
                # Up to the next header that is not one of this table's own sub-tables ([part.options]).
                own = re.compile(rf"\s*\[\s*{re.escape(part)}\.")
                end = next(
                    (n for n in range(start + 1, len(lines)) if re.match(r"\s*\[", lines[n]) and not own.match(lines[n])), len(lines)
                )
                i += 2
                continue
            return _key_line(lines, start, end, part)
        if isinstance(part, str):
            found = _key_line(lines, start, end, part)
            if found is None:
                return None
            if i == len(path) - 1:
                return found
            start = found - 1
        i += 1
    return start + 1 if path else None


def _key_line(lines: list[str], start: int, end: int, key: str) -> int | None:
    pattern = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=|[{{,]\s*{re.escape(key)}\s*=|^\s*\[+\s*(?:[\w-]+\.)*{re.escape(key)}\s*\]")
    for n in range(start, end):
        if pattern.search(lines[n]):
            return n + 1
    return None
