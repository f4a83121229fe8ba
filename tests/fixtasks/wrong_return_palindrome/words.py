def is_palindrome(text):
    """Whether text reads the same backwards, ignoring case."""
    lowered = text.lower()
    return text == lowered[::-1]


def shout(text):
    return text.upper() + "!"
