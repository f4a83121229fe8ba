def total_upto(n):
    """The sum 1 + 2 + ... + n."""
    return sum(range(n))


def count_even(n):
    """How many even numbers in 1..n."""
    return n // 2
