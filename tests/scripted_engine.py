"""A stand-in for the model in the coding team's tests: an engine whose answers
are written in advance, chosen by what the prompt asks. Everything after the
answer (the parsing, git apply, the sandboxed tests, the report) is the real
code. Its tokens are bytes (3 + byte), so its tokenizer needs no files; the K/V
bookkeeping is KVEngine's."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Sequence

from runtime.scheduling.work import Work
from tests.kv_engine import EOS, KVEngine

OFFSET = 3


class ByteCodec:
    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages) + "<assistant>\n"
        return [OFFSET + b for b in text.encode()]

    def stream(self) -> _Stream:
        return _Stream()

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")


class _Stream:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(bytes([token - OFFSET])) if token >= OFFSET else ""

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class ScriptedEngine(KVEngine):
    """Answers `answer_for(prompt_text)`, a byte a step, then end-of-sequence.
    Run it without the prefix cache: it reads each prompt from its first chunk on."""

    def __init__(self, answer_for: Callable[[str], str], **kwargs) -> None:
        super().__init__(num_blocks=4096, block_size=16, vocab=OFFSET + 256, eos=True, **kwargs)
        self.tokenizer = ByteCodec()
        self.answer_for = answer_for
        self.prompts: dict[int, list[int]] = {}
        self.answers: dict[int, list[int]] = {}
        self.asked: list[str] = []  # every prompt, as text, in the order answered

    def step(self, batch: Sequence[Work], abandon: object = None) -> list[int | None]:
        super().step(batch, abandon)  # the K/V bookkeeping (its own tokens are discarded)
        out: list[int | None] = []
        for w in batch:
            if w.turn not in self.answers:
                self.prompts.setdefault(w.turn, []).extend(w.tokens)
                if w.sample:
                    text = self.tokenizer.decode(self.prompts[w.turn])
                    self.asked.append(text)
                    self.answers[w.turn] = [OFFSET + b for b in self.answer_for(text).encode()] + [EOS]
            if not w.sample:
                out.append(None)
                continue
            at = w.start + len(w.tokens) - len(self.prompts[w.turn])
            answer = self.answers[w.turn]
            out.append(answer[at] if at < len(answer) else EOS)
        return out
