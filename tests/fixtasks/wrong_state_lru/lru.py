from collections import OrderedDict


class LRUCache:
    """Holds at most `capacity` keys; adding one more evicts the least recently used
    key, where both get and put count as a use."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.data = OrderedDict()

    def get(self, key, default=None):
        if key not in self.data:
            return default
        return self.data[key]

    def put(self, key, value):
        self.data[key] = value
        self.data.move_to_end(key)
        if len(self.data) > self.capacity:
            self.data.popitem(last=True)
