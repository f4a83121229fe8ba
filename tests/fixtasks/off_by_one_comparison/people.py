def is_adult(age):
    """18 or older."""
    return age > 18


def is_child(age):
    return age < 13
