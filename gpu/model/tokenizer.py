"""The model's own tokenizer and chat template, rebuilt from GGUF metadata.

    tok = Tokenizer.from_model(model)
    ids = tok.chat([{"role": "user", "content": "Hi"}])   # rendered template, encoded
    stream = tok.stream()
    for t in new_tokens: print(stream.push(t), end="")   # never splits a UTF-8 character

Two kinds of vocabulary (`tokenizer.ggml.model`), both handed to the `tokenizers` library:

- "gpt2": byte-level BPE. The token strings spell bytes with GPT-2's byte-to-unicode table
  ("Ġ" is a space) and `tokenizer.ggml.merges` lists the merges in priority order. Text is first
  split by the pre-tokenizer `tokenizer.ggml.pre` names (the regexes llama.cpp and the models'
  own tokenizer.json use: gpt2, smollm's digit split, qwen2's single digits, llama-bpe's runs of
  up to 3 digits).
- "llama": SentencePiece BPE (Llama 2, Gemma). "▁" is a space, `tokenizer.ggml.scores` ranks
  the pieces (the highest-scoring merge first, as sentencepiece does), and a character with no
  piece falls back to its UTF-8 bytes' <0xXX> tokens.

Control tokens (token_type 3, e.g. <|im_start|>) become special added tokens, so they are matched
as whole tokens wherever they appear in the text — that is what makes a rendered chat template
encode right. The chat template itself is gpu/model/templates.py's.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from gpu.model.load import Model
from gpu.model.sentencepiece import build_spm, spm_token_bytes
from gpu.model.templates import ChatTemplate, plain_prompt
from runtime.errors import ModelFormatError, UnsupportedModelError
from runtime.toolcalls import HERMES, ToolCallFormat, template_messages
from runtime.tools import ToolSpec

# Pre-tokenizers by `tokenizer.ggml.pre`, as llama.cpp's llama-vocab.cpp groups them. The
# StarCoder family (SmolLM among them) splits every digit on its own before GPT-2's regex.
_DIGIT_SPLITTING = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_PLAIN_GPT2 = {"gpt2", "default", ""}
# Qwen2's and Llama 3's split regexes (their tokenizer.json; llama.cpp's QWEN2 / LLAMA3): letters
# with one leading non-letter, digits one at a time (Qwen) or up to three (Llama 3),
# punctuation runs, newlines, and whitespace that leaves the last space to the next word.
_SPLIT_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|DIGITS| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_REGEX_SPLITTING = {
    "qwen2": _SPLIT_REGEX.replace("DIGITS", r"\p{N}"),
    "llama-bpe": _SPLIT_REGEX.replace("DIGITS", r"\p{N}{1,3}"),
}
_NFC = {"qwen2"}  # Qwen2's tokenizer.json normalizes to NFC first
PRE_TOKENIZERS = sorted(_DIGIT_SPLITTING | _REGEX_SPLITTING.keys() | _PLAIN_GPT2 - {""})

_KIND_NAMES = {str: "strings", int: "integers", (int, float): "numbers"}

END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character (printable bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Tokenizer:
    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        *,
        bos_id: int,
        eos_id: int,
        pre: str = "gpt2",
        chat_template: str | None = None,
        name: str = "model",
        kind: str = "gpt2",
        scores: Sequence[float] | None = None,
        add_bos: bool = False,
        add_space_prefix: bool = False,
    ) -> None:
        self.name = name
        self.vocab_size = len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        if kind == "llama":
            self._token_bytes = spm_token_bytes(tokens, token_types, name)
            self._hf = build_spm(tokens, token_types, scores, add_space_prefix, name)
            _add_special(self._hf, tokens, token_types)
        else:
            self._token_bytes = _token_bytes(tokens, token_types)
            self._hf = _build_bpe(tokens, token_types, merges, pre, name)
        index = {t: i for i, t in enumerate(tokens)}
        ends = {eos_id} | {index[t] for t in END_OF_TURN_TOKENS if t in index}
        self.eos_ids: frozenset[int] = frozenset(ends)
        self.special_ids: frozenset[int] = frozenset(i for i, t in enumerate(token_types) if t == gguf.TokenType.CONTROL)
        self._tokens = list(tokens)
        # Some vocabularies (SmolLM2's among them) lack a token for a few bytes (rare control
        # characters, UTF-8 lead bytes 0xF1/0xF2 of planes 4-12). Like the model's own tokenizer,
        # encode drops such bytes silently; this says which they are.
        present = set(tokens)
        self.missing_bytes: frozenset[int] = (
            frozenset(b for b, c in bytes_to_unicode().items() if c not in present) if kind == "gpt2" else frozenset()
        )
        specials = {"bos_token": tokens[bos_id], "eos_token": tokens[eos_id]}
        self._template = ChatTemplate(chat_template, name, specials) if chat_template else None

    @classmethod
    def from_model(cls, model: Model) -> Tokenizer:
        md = model.metadata

        def need(key: str) -> object:
            if key not in md:
                raise ModelFormatError(f"{model.path}: metadata key {key!r} is missing")
            return md[key]

        kind = need("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"{model.path}: tokenizer {kind!r} is not supported (only byte-level BPE 'gpt2' and SentencePiece 'llama')"
            )

        def list_of(key: str, kinds: type | tuple[type, ...], length: int | None = None) -> list:
            value = need(key)
            if not isinstance(value, list) or not all(isinstance(x, kinds) and not isinstance(x, bool) for x in value):
                raise ModelFormatError(f"{model.path}: metadata key {key!r} is not a list of {_KIND_NAMES[kinds]}")
            if length is not None and len(value) != length:
                raise ModelFormatError(f"{model.path}: metadata key {key!r} has {len(value)} entries, the vocabulary {length}")
            return value

        def token_id(key: str) -> int:
            value = need(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(tokens):
                raise ModelFormatError(f"{model.path}: metadata key {key!r} = {value!r} is not a token id (0..{len(tokens) - 1})")
            return value

        def text(key: str, default: str | None) -> str | None:
            value = md.get(key, default)
            if value is not None and not isinstance(value, str):
                raise ModelFormatError(f"{model.path}: metadata key {key!r} is not a string")
            return value

        tokens = list_of("tokenizer.ggml.tokens", str)
        if len(tokens) != model.config.vocab_size:
            raise ModelFormatError(f"{model.path}: {len(tokens)} tokens in the vocabulary but vocab_size is {model.config.vocab_size}")
        if "tokenizer.ggml.token_type" in md:
            types = list_of("tokenizer.ggml.token_type", int, len(tokens))
        else:
            types = [int(gguf.TokenType.NORMAL)] * len(tokens)
        return cls(
            tokens,
            types,
            list_of("tokenizer.ggml.merges", str) if kind == "gpt2" else (),
            bos_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_id=token_id("tokenizer.ggml.eos_token_id"),
            pre=str(text("tokenizer.ggml.pre", "gpt2")),
            chat_template=text("tokenizer.chat_template", None),
            name=str(model.path),
            kind=str(kind),
            scores=list_of("tokenizer.ggml.scores", (int, float), len(tokens)) if kind == "llama" else None,
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", kind == "llama")),
            add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", True)),
        )

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str) -> list[int]:
        """Ids for `text`, no BOS added. Control-token spellings in the text become control tokens.
        Bytes in `missing_bytes` are dropped."""
        # encode_batch, not encode: it lets go of the GIL while it works, so a long
        # text tokenized in a worker thread does not stall the event loop.
        return self._hf.encode_batch([text], add_special_tokens=False)[0].ids

    def same_vocabulary(self, other: Tokenizer) -> bool:
        """Whether every token id means the same text in both (a draft model's
        tokens are the target's: runtime.owner.drafter)."""
        return self._tokens == other._tokens and self.eos_ids == other.eos_ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text for `ids`; the exact inverse of `encode` on valid UTF-8. Invalid byte runs
        (a character cut off mid-way) decode to U+FFFD."""
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and i in self.special_ids))
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self._token_bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The vocabulary spelling (byte-level, e.g. 'Ġworld'), for debugging."""
        return self._tokens[token_id]

    def stream(self, *, skip_special: bool = True) -> TextStream:
        return TextStream(self, skip_special=skip_special)

    # ------------------------------------------------------------------ chat

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *, tools: Sequence[ToolSpec] = ()
    ) -> str:
        """The model's chat template over `messages` (a plain 'Role: text' format without one).
        With `tools`, or with tool calls and results in the messages, the template renders
        them if it knows tools; else they are written into plain messages first, in the
        model's tool-call format (runtime.toolcalls)."""
        uses_tools = bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
        if uses_tools and self._template is not None and self._template.takes_tools:
            return self._template.render(template_messages(messages), add_generation_prompt, tools=[t.as_openai() for t in tools] or None)
        if uses_tools:
            messages = self.tool_format.fold(messages, tools)
        if self._template is None:
            return plain_prompt(messages, add_generation_prompt, self.name)
        return self._template.render(messages, add_generation_prompt)

    def chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *, tools: Sequence[ToolSpec] = ()
    ) -> list[int]:
        """The rendered chat, encoded; BOS first when the model asks for it and the template
        did not write it."""
        ids = self.encode(self.render_chat(messages, add_generation_prompt, tools=tools))
        if self.add_bos and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    @property
    def tool_format(self) -> ToolCallFormat:
        """How this model writes tool calls: every catalogue model's is Qwen2.5's
        (see runtime.toolcalls for why SmolLM2 and Gemma share it)."""
        return HERMES


class TextStream:
    """Turns token ids, one at a time, into text pieces. A UTF-8 character split across tokens
    (emoji, CJK) is held back until its last byte arrives, so the pieces concatenate to exactly
    `tokenizer.decode(ids)` (modulo skipped control tokens)."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip_special and token_id in self._tokenizer.special_ids:
            return ""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character comes out as U+FFFD)."""
        return self._decoder.decode(b"", final=True)


# ---------------------------------------------------------------------- building


def _token_bytes(tokens: Sequence[str], types: Sequence[int]) -> list[bytes]:
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    out = []
    for text, kind in zip(tokens, types, strict=False):
        if kind in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED):
            out.append(text.encode("utf-8"))  # spelled literally, not byte-level
        else:
            out.append(bytes(to_byte[c] if c in to_byte else ord(c) & 0xFF for c in text))
    return out


def _build_bpe(tokens: Sequence[str], types: Sequence[int], merges: Sequence[str], pre: str, name: str) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelFormatError(f"{name}: malformed BPE merge {m!r}")
        # `tokenizers` refuses such a merge with a bare Exception; say which one and where.
        for piece in (a, b, a + b):
            if piece not in vocab:
                raise ModelFormatError(f"{name}: BPE merge {m!r} names {piece!r}, which is not in the vocabulary")
        pairs.append((a, b))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLITTING:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _PLAIN_GPT2:
        tok.pre_tokenizer = byte_level
    elif pre in _REGEX_SPLITTING:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_REGEX_SPLITTING[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        if pre in _NFC:
            tok.normalizer = normalizers.NFC()
    else:
        raise UnsupportedModelError(f"{name}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})")
    tok.decoder = decoders.ByteLevel()
    _add_special(tok, tokens, types)
    return tok


def _add_special(tok: HFTokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    control = [
        AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types, strict=False) if kind == gguf.TokenType.CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(tokens, types, strict=False)
        if kind == gguf.TokenType.USER_DEFINED
    ]
    tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)
