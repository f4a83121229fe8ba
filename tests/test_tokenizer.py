"""The tokenizer rebuilt from GGUF metadata: special tokens, exact round trips, known SmolLM2
encodings, the chat template, and streaming text that never splits a character."""

from __future__ import annotations

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu.model.load import Model
from gpu.model.synthetic import tiny_vocab
from gpu.model.tokenizer import Tokenizer, bytes_to_unicode
from runtime.errors import ConfigError

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n\n\tprint(add(1, 2))",
    "naïve café, Zürich — “quotes” and ½",
    "日本語のテキスト、中文，한국어",
    "emoji: 🙂👍🏽🇫🇷 👩‍👩‍👧",
    "   leading and trailing spaces   ",
    "",
]

text_without_specials = st.text(max_size=80).filter(lambda s: "<|" not in s)


# ---------------------------------------------------------------- the tiny tokenizer


@pytest.fixture(scope="module")
def tiny_tok(tiny_model: Model) -> Tokenizer:
    return Tokenizer.from_model(tiny_model)


def test_bytes_to_unicode_is_a_bijection() -> None:
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"


def test_tiny_uses_its_merges(tiny_tok: Tokenizer) -> None:
    tokens, _, _ = tiny_vocab()
    assert tiny_tok.encode(" the") == [tokens.index("Ġthe")]
    assert tiny_tok.encode("sing") == [tokens.index("s"), tokens.index("ing")]


@settings(max_examples=150, deadline=None)
@given(text_without_specials)
def test_tiny_round_trip(tiny_tok: Tokenizer, text: str) -> None:
    assert tiny_tok.decode(tiny_tok.encode(text)) == text


def test_tiny_chat(tiny_tok: Tokenizer) -> None:
    ids = tiny_tok.chat([{"role": "user", "content": "hi"}])
    assert ids[0] == 1  # <|im_start|>
    assert tiny_tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tiny_tok.eos_ids == {0, 2}


def test_template_raise_exception_is_a_config_error(tiny_model: Model) -> None:
    md = tiny_model.metadata
    tok = Tokenizer(
        md["tokenizer.ggml.tokens"],
        md["tokenizer.ggml.token_type"],
        md["tokenizer.ggml.merges"],
        bos_id=1,
        eos_id=2,
        pre="smollm",
        chat_template="{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}x",
    )
    assert tok.render_chat([{"role": "user", "content": ""}]) == "x"
    with pytest.raises(ConfigError, match="user first"):
        tok.chat([{"role": "assistant", "content": "hi"}])


def test_decode_rejects_ids_outside_vocab(tiny_tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_tok.decode([tiny_tok.vocab_size])


# ---------------------------------------------------------------- SmolLM2


@pytest.mark.model
def test_special_tokens_are_single_ids(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[-1] == 2
    assert tok.bos_id == 1
    assert tok.eos_ids == {0, 2}


@pytest.mark.model
def test_known_encodings(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    hello = tok.encode("Hello world")
    assert [tok.token_text(i) for i in hello] == ["Hello", "Ġworld"]
    # SmolLM's pre-tokenizer splits every digit on its own
    assert [tok.token_text(i) for i in tok.encode(" 2024")] == ["Ġ", "2", "0", "2", "4"]
    assert [tok.token_text(i) for i in tok.encode("user\n")] == ["user", "Ċ"]
    assert tok.encode(" the") == [tok.encode(" the")[0]] and tok.token_text(tok.encode(" the")[0]) == "Ġthe"


@pytest.mark.model
@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(smollm2_tokenizer: Tokenizer, text: str) -> None:
    assert smollm2_tokenizer.decode(smollm2_tokenizer.encode(text)) == text


@pytest.mark.model
@settings(max_examples=150, deadline=None)
@given(text_without_specials)
def test_round_trip_any_text(smollm2_tokenizer: Tokenizer, text: str) -> None:
    tok = smollm2_tokenizer
    data = text.encode("utf-8")
    kept = bytes(b for b in data if b not in tok.missing_bytes)  # almost always all of them
    assert tok.decode(tok.encode(text)) == kept.decode("utf-8", errors="replace")


@pytest.mark.model
def test_bytes_without_a_token_are_dropped(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    assert 0xF1 in tok.missing_bytes and ord("a") not in tok.missing_bytes
    assert tok.decode(tok.encode("a\x04b")) == "ab"


@pytest.mark.model
def test_chat_renders_the_models_template(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.chat([{"role": "user", "content": "What is the capital of France?"}])
    assert ids[0] == 1
    assert ids[-4:] == tok.encode("<|im_start|>assistant\n")
    text = tok.decode(ids)
    # SmolLM2's template adds its default system prompt when none is given
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    with_system = tok.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert tok.decode(with_system) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.model
@pytest.mark.parametrize("text", SAMPLES)
def test_text_stream_reassembles_characters(smollm2_tokenizer: Tokenizer, text: str) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.model
def test_text_stream_holds_back_partial_characters(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode("👍🏽")
    assert len(ids) > 1  # the emoji's bytes span several tokens
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    assert pieces[0] == ""  # an incomplete character is not emitted
    assert "".join(pieces) == "👍🏽"
    cut = tok.stream()
    assert cut.push(ids[0]) == "" and cut.flush() == "\ufffd"


@pytest.mark.model
def test_text_stream_skips_control_tokens(smollm2_tokenizer: Tokenizer) -> None:
    tok = smollm2_tokenizer
    ids = tok.encode("Paris.<|im_end|>")
    assert "".join(tok.stream().push(i) for i in ids) == "Paris."
    assert "".join(tok.stream(skip_special=False).push(i) for i in ids) == "Paris.<|im_end|>"
    assert tok.decode(ids, skip_special=True) == "Paris."


# ---------------------------------------------------------------- chat templates


def template_tokenizer(tiny_model: Model, template: str | None) -> Tokenizer:
    md = tiny_model.metadata
    return Tokenizer(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], md["tokenizer.ggml.merges"],
                     bos_id=1, eos_id=2, pre="smollm", chat_template=template)  # fmt: skip


def test_template_environment_matches_hugging_face(tiny_model: Model) -> None:
    """Loop controls, tojson without HTML escaping (non-ASCII kept), strftime_now, and the
    special tokens as variables, as transformers' apply_chat_template provides them."""
    tok = template_tokenizer(
        tiny_model,
        (
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
            "{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson }};{% endfor %}"
            "{{ {'a': '<b> & é'} | tojson(indent=1) }}|{{ strftime_now('%Y') }}"
        ),
    )
    import datetime

    text = tok.render_chat([{"role": "skip", "content": "x"}, {"role": "user", "content": "é<&>"},
                            {"role": "assistant", "content": "2"}, {"role": "user", "content": "3"}])  # fmt: skip
    want_json = '{"role": "user", "content": "é<&>"};'  # loop.index counts the skipped one: break at 3
    assert text == f'<|im_start|>{want_json}{{\n "a": "<b> & é"\n}}|{datetime.date.today().year}'


def test_model_without_template_gets_the_plain_format_and_a_note(tiny_model: Model, caplog) -> None:
    tok = template_tokenizer(tiny_model, None)
    with caplog.at_level("INFO", logger="slotswarm.tokenizer"):
        text = tok.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    assert not tok.has_chat_template and "no chat template" in caplog.text


# ---------------------------------------------------------------- SentencePiece


def test_sentencepiece_merges_by_score_and_falls_back_to_bytes() -> None:
    """A hand-made 'llama' vocabulary: pieces merge highest score first, '▁' is a space, a
    character without a piece becomes its UTF-8 bytes' <0xXX> tokens, control tokens stay whole."""
    T = gguf.TokenType
    pieces = [("<unk>", T.UNKNOWN, 0.0), ("<s>", T.CONTROL, 0.0), ("</s>", T.CONTROL, 0.0)]
    pieces += [(f"<0x{b:02X}>", T.BYTE, 0.0) for b in range(256)]
    pieces += [(p, T.NORMAL, s) for p, s in [("▁", -1.0), ("h", -2.0), ("i", -2.0), ("a", -2.0), ("▁h", -3.0),
                                             ("hi", -0.5), ("▁hi", -0.1), ("ha", -5.0)]]  # fmt: skip
    tok = Tokenizer([p for p, _, _ in pieces], [int(k) for _, k, _ in pieces], [], bos_id=1, eos_id=2,
                    kind="llama", scores=[s for _, _, s in pieces], add_bos=True, add_space_prefix=False)  # fmt: skip
    ids = {p: i for i, (p, _, _) in enumerate(pieces)}
    assert tok.encode("hi hi") == [ids["hi"], ids["▁hi"]]
    assert tok.encode("é</s>") == [ids["<0xC3>"], ids["<0xA9>"], 2]
    assert tok.decode(tok.encode("hai é")) == "hai é"
    assert tok.chat([{"role": "user", "content": "hi"}])[0] == 1  # add_bos, no template
