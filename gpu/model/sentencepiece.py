"""SentencePiece BPE vocabularies (`tokenizer.ggml.model` = "llama": Llama 2, Gemma) for the
`tokenizers` library. "▁" spells a space, `tokenizer.ggml.scores` ranks the pieces (sentencepiece
merges the highest-scoring pair first), and a character with no piece falls back to the
<0xXX> tokens of its UTF-8 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import gguf
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers

from runtime.errors import ModelFormatError

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def spm_token_bytes(tokens: Sequence[str], types: Sequence[int], name: str) -> list[bytes]:
    out = []
    for i, (text, kind) in enumerate(zip(tokens, types, strict=False)):
        if kind == gguf.TokenType.BYTE:
            if not _BYTE_TOKEN.fullmatch(text):
                raise ModelFormatError(f"{name}: byte token {i} is spelt {text!r}, not <0xXX>")
            out.append(bytes([int(text[3:-1], 16)]))  # "<0x0A>"
        elif kind in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED, gguf.TokenType.UNKNOWN):
            out.append(text.encode("utf-8"))
        else:
            out.append(text.replace("\u2581", " ").encode("utf-8"))
    return out


def build_spm(
    tokens: Sequence[str], types: Sequence[int], scores: Sequence[float] | None, add_space_prefix: bool, name: str
) -> HFTokenizer:
    """SentencePiece BPE as `tokenizers` BPE, the way transformers converts it: merges are every
    split of a normal piece into two pieces, ranked by the merged piece's score. The caller adds
    the control and user-defined pieces."""
    if scores is None or len(scores) != len(tokens):
        raise ModelFormatError(f"{name}: tokenizer.ggml.scores is missing or the wrong length")
    vocab = {t: i for i, t in enumerate(tokens)}
    normal = sorted((i for i, k in enumerate(types) if k == gguf.TokenType.NORMAL), key=lambda i: -scores[i])
    merges = []
    for i in normal:
        piece = tokens[i]
        splits = [(piece[:j], piece[j:]) for j in range(1, len(piece)) if piece[:j] in vocab and piece[j:] in vocab]
        merges += sorted(splits, key=lambda ab: (vocab[ab[0]], vocab[ab[1]]))
    unk = next((tokens[i] for i, k in enumerate(types) if k == gguf.TokenType.UNKNOWN), None)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    replace = normalizers.Replace(" ", "\u2581")
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if add_space_prefix else replace
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok
