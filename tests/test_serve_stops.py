"""Stop strings on streamed text: nothing of a stop string is ever sent, however
the text is cut into pieces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from swarm.server.turn import StopScanner


def scan(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    out = []
    for piece in pieces:
        out.append(scanner.push(piece))
        if scanner.hit:
            return "".join(out), True
    return "".join(out) + scanner.flush(), False


def test_a_stop_string_split_across_pieces_is_held_back_then_cut() -> None:
    scanner = StopScanner(["END", "\n\n"])
    assert [scanner.push(p) for p in ("abcE", "N")] == ["abc", ""]
    assert scanner.push("Dxyz") == "" and scanner.hit


def test_held_back_text_comes_out_when_it_turns_out_not_to_stop() -> None:
    assert scan(["abcE", "Nx", "yz"], ["END"]) == ("abcENxyz", False)


@given(
    text=st.text(alphabet="abE\nND", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    stop=st.text(alphabet="abEND\n", min_size=1, max_size=4),
)
def test_with_one_stop_string_the_result_never_depends_on_how_the_text_is_cut(text: str, cuts: list[int], stop: str) -> None:
    # (With several, overlapping ones can differ: which completes first depends on the pieces.)
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    at = text.find(stop)
    assert scan(pieces, [stop]) == ((text[:at], True) if at >= 0 else (text, False))
