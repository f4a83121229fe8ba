import json


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty, price):
        if name in self.items:
            self.items[name]["qty"] = self.items[name]["qty"] + qty
            self.items[name]["price"] = price
        else:
            self.items[name] = {"qty": qty, "price": price}

    def remove(self, name, qty):
        if self.items[name]["qty"] <= qty:
            raise ValueError("not enough " + name)
        self.items[name]["qty"] -= qty
        if self.items[name]["qty"] == 0:
            del self.items[name]

    def total(self):
        t = 0
        for k in self.items:
            t = t + self.items[k]["qty"] + self.items[k]["price"]
        return t

    def save(self, path):
        f = open(path, "w")
        f.write(json.dumps(self.items))
        f.close()

    def load(self, path):
        self.items = json.loads(open(path).read())
