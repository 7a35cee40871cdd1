"""Fixed prompt sets for benchmarks and model measurements.

HELD_OUT_CODE was written for this repository after the models were trained, so no model saw
it. COPY_HEAVY asks for near-copies of code already in the prompt (edits, renames), where prompt
lookup shines. PROSE is plain English, where n-gram lookups rarely hit.
"""

HELD_OUT_CODE = [
    'def rolling_mean(values, window):\n    """Mean of each run of `window` consecutive values."""\n',
    "class RateLimiter:\n    def __init__(self, rate, burst):\n        self.rate = rate\n",
    'def parse_duration(text):\n    units = {"s": 1, "m": 60, "h": 3600}\n',
    "import heapq\n\n\ndef k_smallest(items, k):\n",
    "def flatten(nested):\n    out = []\n    for item in nested:\n",
    "class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count):\n",
    "def retry(times, delay):\n    def decorator(func):\n",
    'def chunked(iterable, size):\n    """Yield lists of at most `size` items."""\n',
]

_RECORD = """class Order:
    def __init__(self, order_id, customer, total):
        self.order_id = order_id
        self.customer = customer
        self.total = total

    def to_dict(self):
        return {"order_id": self.order_id, "customer": self.customer, "total": self.total}

    def __repr__(self):
        return f"Order({self.order_id!r}, {self.customer!r}, {self.total!r})"


"""

COPY_HEAVY = [
    _RECORD + "class Invoice:\n    def __init__(self, invoice_id, customer, total):\n",
    _RECORD + "class Refund:\n    def __init__(self, refund_id, customer, total):\n",
    "def area_of_square(side):\n    return side * side\n\n\ndef area_of_rectangle(width, height):\n"
    "    return width * height\n\n\ndef area_of_square(side):\n    return side * side\n\n\n"
    "def area_of_rectangle(",
    'CONFIG = {\n    "host": "localhost",\n    "port": 8080,\n    "debug": False,\n'
    '    "workers": 4,\n}\n\nTEST_CONFIG = {\n    "host": "localhost",\n',
]

PROSE = [
    "The weather this spring has been unusually mild, and the gardens along the river",
    "When the committee met on Tuesday, the first item on the agenda was the budget for",
    "Most people who learn to cook start with a few simple recipes and then slowly",
    "The history of the town begins with a small market that traders used on their way",
]
