def can_vote(age, citizen):
    """Only adult citizens may vote."""
    return age >= 18 or citizen


def can_drive(age):
    return age >= 17
