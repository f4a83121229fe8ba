"""Chat templates, rendered the way Hugging Face's `apply_chat_template` renders them.

    template = ChatTemplate(source, name, special_tokens={"bos_token": "<s>", ...})
    text = template.render(messages, add_generation_prompt=True)

The environment matches transformers' (`_compile_jinja_template`): sandboxed (the template comes
from a downloaded file), trim_blocks and lstrip_blocks, the loop-controls extension ({% break %},
{% continue %}), a `tojson` that does not HTML-escape, and the globals `raise_exception` and
`strftime_now`. A model without a template gets `plain_prompt` and one note in the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox

from runtime.errors import ConfigError, ModelFormatError

log = logging.getLogger("slotswarm.tokenizer")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; templates expect plain JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, name: str, special_tokens: Mapping[str, str]) -> None:
        self.name = name
        self.special_tokens = dict(special_tokens)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
            # A template that reads `tools` renders tool definitions, calls and results itself.
            self.takes_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateError as e:
            raise ModelFormatError(f"{name}: tokenizer.chat_template does not compile ({e})") from e

    def render(self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True, **extra) -> str:
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **extra,
            )
        except jinja2.TemplateError as e:  # raise_exception() in the template, or a bad message
            raise ConfigError(f"{self.name}: the chat template rejected the messages ({e})") from e


_noted: set[str] = set()


def plain_prompt(messages: Sequence[Mapping[str, object]], add_generation_prompt: bool, name: str) -> str:
    """A model without a chat template (a base model) continues plain text: each message as
    'Role: content' on its own paragraph, then 'Assistant:' to continue from."""
    if name not in _noted:
        _noted.add(name)
        log.info("%s has no chat template; prompts use the plain 'Role: text' format", name)
    parts = [f"{str(m.get('role', 'user')).capitalize()}: {m.get('content', '')}" for m in messages]
    if add_generation_prompt:
        parts.append("Assistant:")
    return "\n\n".join(parts)
