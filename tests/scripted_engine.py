"""A stand-in for the model in the coding team's tests: an engine whose answers
are written in advance, chosen by what the prompt asks. Everything after the
answer (the parsing, git apply, the sandboxed tests, the report) is the real
code. Its tokens are bytes (3 + byte), so its tokenizer needs no files; the K/V
bookkeeping is KVEngine's.

It holds a constrained turn to its constraint as a model's engine does, with
the same compiler and masks (gpu.grammar, gpu.masks) over its byte vocabulary:
the written answer is what it would say, and each byte the constraint does not
allow there gives way to the first one it does (a masked argmax). An answer
written in the constraint's shape comes out as written; one that is not comes
out bent into it, as a real model's would."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from gpu.grammar import ConstraintCompiler
from gpu.masks import TurnMasks
from runtime.scheduling.work import DeadEnd, Work
from tests.kv_engine import EOS, KVEngine

OFFSET = 3
VOCAB = OFFSET + 256


class ByteCodec:
    def chat(self, messages: list[dict[str, Any]], *, tools: Sequence[Any] = ()) -> list[int]:
        listed = "".join(f"<tool>{t.name}: {t.description}</tool>\n" for t in tools)
        text = listed + "".join(f"<{m['role']}>\n{m.get('content') or ''}{_calls(m)}\n" for m in messages) + "<assistant>\n"
        return [OFFSET + b for b in text.encode()]

    def encode(self, text: str) -> list[int]:
        return [OFFSET + b for b in text.encode()]

    def stream(self) -> _Stream:
        return _Stream()

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")

    def same_vocabulary(self, other: Any) -> bool:
        return isinstance(other, ByteCodec)

    # What gpu.grammar's token table reads from a tokenizer.
    eos_id, bos_id, vocab_size = EOS, 1, VOCAB
    eos_ids = frozenset({EOS})
    special_ids = frozenset({0, 1, EOS})

    def token_bytes(self, token: int) -> bytes:
        return bytes([token - OFFSET]) if token >= OFFSET else b"<s%d>" % token


def _calls(message: dict[str, Any]) -> str:
    return "".join(f"\n<call>{c['function']['name']} {c['function']['arguments']}</call>" for c in message.get("tool_calls") or ())


class _Stream:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token - OFFSET])) if token >= OFFSET else ""

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class ScriptedEngine(KVEngine):
    """Answers `answer_for(prompt_text)`, a byte a step, then end-of-sequence,
    held to the turn's constraint if it has one. Run it without the prefix
    cache: it reads each prompt from its first chunk on."""

    def __init__(self, answer_for: Callable[[str], str], **kwargs) -> None:
        super().__init__(num_blocks=4096, block_size=16, vocab=VOCAB, eos=True, **kwargs)
        self.tokenizer = ByteCodec()
        self.constraints = ConstraintCompiler(self.tokenizer, VOCAB)
        self.masks = TurnMasks(self.constraints)
        self.answer_for = answer_for
        self.prompts: dict[int, list[int]] = {}
        self.answers: dict[int, list[int]] = {}
        self.asked: list[str] = []  # every prompt, as text, in the order answered
        self.bent = 0  # bytes of written answers a constraint did not allow

    def step(self, batch: Sequence[Work], abandon: object = None) -> list[int | None]:
        super().step(batch, abandon)  # the K/V bookkeeping (its own tokens are discarded)
        began = self.masks.begin_step()
        try:
            return self._answer(batch)
        finally:
            self.masks.end_step(began)

    def _answer(self, batch: Sequence[Work]) -> list[int | None]:
        out: list[int | None] = []
        dead: dict[int, str] = {}
        for w in batch:
            if w.turn not in self.answers:
                prompt = self.prompts.setdefault(w.turn, [])
                prompt[w.start :] = w.tokens  # by position: a step taken back and sent again reads the same
                if w.sample:
                    text = self.tokenizer.decode(self.prompts[w.turn])
                    self.asked.append(text)
                    self.answers[w.turn] = [OFFSET + b for b in self.answer_for(text).encode()] + [EOS]
            if not w.sample:
                out.append(None)
                continue
            at = w.start + len(w.tokens) - len(self.prompts[w.turn])
            answer = self.answers[w.turn]
            token = answer[at] if at < len(answer) else EOS
            if w.constraint is not None:
                row = np.zeros((1, self.masks.words), np.int32)
                why = self.masks.fill([w], row).get(w.turn)
                if why is not None:
                    dead[w.turn] = why
                    out.append(None)
                    continue
                allowed = np.unpackbits(row[0].view(np.uint8), bitorder="little")[:VOCAB]
                if not allowed[token]:
                    self.bent += 1
                    token = int(np.flatnonzero(allowed)[0])
            out.append(token)
        if dead:
            raise DeadEnd(out, dead)
        return out

    def calibrate(self) -> None:
        # An owner starting (before any turn of it): it numbers its turns from 1,
        # as the last swarm on this engine did.
        self.prompts.clear()
        self.answers.clear()
        self.masks = TurnMasks(self.constraints)

    def forget(self, turn: int) -> None:
        super().forget(turn)
        self.masks.forget(turn)
