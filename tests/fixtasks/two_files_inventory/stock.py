class Inventory:
    """Counts of items on hand. An item whose count falls to zero is no longer listed."""

    def __init__(self):
        self.counts = {}

    def add(self, item, n=1):
        self.counts[item] = self.counts.get(item, 0) + n

    def remove(self, item, n=1):
        if self.counts.get(item, 0) < n:
            raise ValueError(f"only {self.counts.get(item, 0)} of {item} on hand")
        self.counts[item] -= n

    def items(self):
        return sorted(self.counts)
