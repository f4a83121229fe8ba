from words import is_palindrome, shout


def test_is_palindrome():
    assert is_palindrome("Abba")
    assert is_palindrome("level")
    assert not is_palindrome("hello")


def test_shout():
    assert shout("hi") == "HI!"
