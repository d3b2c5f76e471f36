"""The synthetic WebShop: a seeded product catalogue, shopping goals made from it, BM25 search, WebShop's reward.

Everything here is generated, so the env needs neither Java nor WebShop's 1.1M-product
download. The vocabulary (product types, attributes, options, brands) was written for
this project; the structure follows WebShop (Yao et al., 2022, arXiv 2207.01206): each
product has a type and category path, attributes, option dimensions (color, size, ...),
and a price, and each goal is made from one product: some of its attributes, one value
per option dimension, and a price bound above its price.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProductType:
    name: str
    """What the product is called in goals and searches, e.g. "t-shirt"."""
    category: tuple[str, ...]
    """Category path from the department down, as WebShop's `product_category`."""
    title_noun: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    """(dimension, values) pairs, e.g. ("color", ("black", "red", ...))."""
    price_range: tuple[float, float]


_COLORS = ("black", "white", "red", "blue", "navy", "grey", "green", "pink", "beige", "purple", "yellow", "brown")
_CLOTHING_SIZES = ("xs", "s", "m", "l", "xl", "xxl")

PRODUCT_TYPES: tuple[ProductType, ...] = (
    ProductType(
        "t-shirt", ("clothing", "tops", "t-shirts"), "T-Shirt",
        ("cotton", "slim fit", "relaxed fit", "short sleeve", "long sleeve", "crew neck", "v-neck",
         "moisture wicking", "machine washable"),
        (("color", _COLORS), ("size", _CLOTHING_SIZES)), (8, 40),
    ),
    ProductType(
        "hoodie", ("clothing", "tops", "hoodies"), "Hoodie",
        ("fleece lined", "zip up", "pullover", "heavyweight", "cotton blend", "oversized", "machine washable"),
        (("color", _COLORS), ("size", _CLOTHING_SIZES)), (20, 70),
    ),
    ProductType(
        "jeans", ("clothing", "bottoms", "jeans"), "Jeans",
        ("slim fit", "straight leg", "stretch", "high waist", "relaxed fit", "distressed", "dark wash"),
        (("color", ("blue", "black", "grey", "white")), ("size", ("28", "30", "32", "34", "36", "38"))), (25, 90),
    ),
    ProductType(
        "running shoes", ("clothing", "shoes", "running shoes"), "Running Shoes",
        ("lightweight", "breathable", "cushioned", "non slip", "waterproof", "wide fit"),
        (("color", _COLORS), ("size", ("6", "7", "8", "9", "10", "11", "12"))), (35, 160),
    ),
    ProductType(
        "socks", ("clothing", "accessories", "socks"), "Socks",
        ("cotton", "wool", "ankle", "cushioned", "moisture wicking", "no show", "compression"),
        (("color", ("black", "white", "grey", "navy")), ("size", ("s", "m", "l"))), (6, 25),
    ),
    ProductType(
        "headphones", ("electronics", "audio", "headphones"), "Headphones",
        ("wireless", "bluetooth", "noise cancelling", "over ear", "foldable", "long battery life",
         "built-in microphone"),
        (("color", ("black", "white", "silver", "blue")),), (15, 300),
    ),
    ProductType(
        "phone case", ("electronics", "phone accessories", "cases"), "Phone Case",
        ("shockproof", "slim", "clear", "magnetic", "wallet", "scratch resistant"),
        (("color", ("black", "clear", "blue", "pink", "green")),
         ("model", ("iphone 14", "iphone 15", "galaxy s23", "galaxy s24", "pixel 8"))), (8, 45),
    ),
    ProductType(
        "power bank", ("electronics", "phone accessories", "chargers"), "Power Bank",
        ("fast charging", "compact", "usb c", "wireless charging", "led display"),
        (("capacity", ("5000 mah", "10000 mah", "20000 mah")), ("color", ("black", "white", "blue"))), (15, 70),
    ),
    ProductType(
        "desk lamp", ("home", "lighting", "desk lamps"), "Desk Lamp",
        ("led", "dimmable", "usb charging", "touch control", "adjustable arm", "eye caring"),
        (("color", ("black", "white", "silver", "gold")),), (15, 80),
    ),
    ProductType(
        "water bottle", ("home", "kitchen", "water bottles"), "Water Bottle",
        ("insulated", "stainless steel", "bpa free", "leak proof", "wide mouth", "dishwasher safe"),
        (("size", ("12 oz", "20 oz", "32 oz", "40 oz")), ("color", _COLORS)), (10, 45),
    ),
    ProductType(
        "pillow", ("home", "bedding", "pillows"), "Pillow",
        ("memory foam", "hypoallergenic", "cooling", "down alternative", "adjustable", "washable cover"),
        (("size", ("standard", "queen", "king")),), (15, 80),
    ),
    ProductType(
        "backpack", ("bags", "backpacks", "daypacks"), "Backpack",
        ("waterproof", "anti theft", "lightweight", "laptop", "travel", "usb charging port"),
        (("color", _COLORS),), (20, 120),
    ),
    ProductType(
        "shampoo", ("beauty", "hair care", "shampoo"), "Shampoo",
        ("sulfate free", "paraben free", "moisturizing", "volumizing", "anti dandruff", "vegan"),
        (("scent", ("lavender", "coconut", "mint", "unscented")), ("size", ("8 fl oz", "16 fl oz", "32 fl oz"))),
        (6, 35),
    ),
    ProductType(
        "face cream", ("beauty", "skin care", "moisturizers"), "Face Cream",
        ("moisturizing", "fragrance free", "anti aging", "non greasy", "spf 30", "vegan"),
        (("size", ("1.7 oz", "2.5 oz", "4 oz")),), (10, 60),
    ),
    ProductType(
        "coffee", ("grocery", "beverages", "coffee"), "Coffee",
        ("organic", "fair trade", "whole bean", "ground", "decaf", "dark roast", "medium roast"),
        (("size", ("12 oz", "2 lb", "5 lb")), ("flavor", ("original", "vanilla", "hazelnut", "caramel"))), (8, 60),
    ),
    ProductType(
        "tea", ("grocery", "beverages", "tea"), "Tea",
        ("organic", "caffeine free", "loose leaf", "herbal", "green", "decaf"),
        (("flavor", ("chamomile", "peppermint", "earl grey", "jasmine", "ginger")),
         ("size", ("20 count", "50 count", "100 count"))), (4, 30),
    ),
)  # fmt: skip

BRANDS = (
    "Northpeak", "Lumora", "Kestrel", "Ardent", "Bluefin", "Copperleaf", "Driftwood", "Emberline", "Foxglove",
    "Granite Bay", "Harbor Lane", "Ironbark", "Juniper", "Kitewell", "Larkspur", "Meridian", "Nimbus", "Oakhaven",
    "Pinecrest", "Quillon",
)  # fmt: skip

# Goals bound the price by a round number above it, as WebShop's synthetic goals do.
PRICE_POINTS = (10, 20, 30, 40, 50, 60, 80, 100, 150, 200, 300, 400, 500)
# How an option value reads in a goal: "in red color and size m".
_OPTION_PHRASES = {"color": "{} color", "size": "size {}", "model": "for {}", "capacity": "{}", "scent": "{} scent",
                   "flavor": "{} flavor"}  # fmt: skip
_ACRONYMS = {"bpa": "BPA", "led": "LED", "spf": "SPF", "usb": "USB"}
_ID_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Product:
    asin: str
    """Ten characters starting with B0, like Amazon's ids in WebShop."""
    type: ProductType
    brand: str
    title: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: float
    description: str


@dataclass(frozen=True)
class Goal:
    asin: str
    """The product the goal was made from: it satisfies the goal exactly."""
    type: ProductType
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    """(dimension, wanted value) pairs, one per option dimension of the product."""
    price_upper: float
    instruction: str


class Catalog:
    """Products plus a BM25 index over their text (title, type, category, attributes, option values)."""

    def __init__(self, products: list[Product]) -> None:
        import bm25s  # imported on first use, so `import ragen2.envs` stays fast

        self.products = products
        self.by_asin = {p.asin: p for p in products}
        self._bm25 = bm25s.BM25()
        self._bm25.index([tokenize(_document(p)) for p in products], show_progress=False)

    def search(self, query: str, top_n: int = 50) -> list[Product]:
        """The best `top_n` products for `query` by BM25 (bm25s's defaults: Lucene's variant, k1=1.5, b=0.75).

        Products sharing no word with the query are left out; ties keep catalogue order.
        50 results is WebShop's default.
        """
        tokens = [t for t in tokenize(query) if t in self._bm25.vocab_dict]
        if not tokens:
            return []
        scores = self._bm25.get_scores(tokens)
        order = np.argsort(-scores, kind="stable")[:top_n]
        return [self.products[i] for i in order if scores[i] > 0]


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _document(product: Product) -> str:
    values = " ".join(v for _, vs in product.options for v in vs)
    return f"{product.title} {product.type.name} {' '.join(product.type.category)} {values}"


@functools.lru_cache(maxsize=8)
def build_catalog(num_products: int = 500, seed: int = 0) -> Catalog:
    """A deterministic catalogue of `num_products` products (cached: every env shares one)."""
    rng = np.random.default_rng(seed)
    products, used = [], set()
    for i in range(num_products):
        ptype = PRODUCT_TYPES[i % len(PRODUCT_TYPES)]
        asin = _new_asin(rng, used)
        brand = BRANDS[rng.integers(len(BRANDS))]
        k = int(rng.integers(2, min(4, len(ptype.attributes)) + 1))
        attributes = tuple(sorted(rng.choice(len(ptype.attributes), size=k, replace=False)))
        attributes = tuple(ptype.attributes[j] for j in attributes)
        options = []
        for dim, values in ptype.options:
            n = int(rng.integers(min(2, len(values)), len(values) + 1))
            picks = sorted(rng.choice(len(values), size=n, replace=False))
            options.append((dim, tuple(values[j] for j in picks)))
        lo, hi = ptype.price_range
        price = round(float(rng.uniform(lo, hi))) - 0.01
        title = f"{brand} {' '.join(map(_title_case, attributes[:2]))} {ptype.title_noun}"
        if attributes[2:]:
            title += ", " + ", ".join(map(_title_case, attributes[2:]))
        description = (
            f"The {brand} {ptype.name} is {_join(attributes)}. Choose {_join([dim for dim, _ in options])} "
            f"on the product page."
        )
        products.append(Product(asin, ptype, brand, title, attributes, tuple(options), price, description))
    return Catalog(products)


def _title_case(phrase: str) -> str:
    return " ".join(_ACRONYMS.get(word, word.capitalize()) for word in phrase.split())


def _new_asin(rng: np.random.Generator, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(_ID_CHARS[j] for j in rng.integers(len(_ID_CHARS), size=8))
        if asin not in used:
            used.add(asin)
            return asin


def _join(words: list[str] | tuple[str, ...]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def make_goal(catalog: Catalog, rng: np.random.Generator) -> Goal:
    """A goal made from a random product: 1-3 of its attributes, one value per option, a price bound."""
    product = catalog.products[int(rng.integers(len(catalog.products)))]
    k = int(rng.integers(1, min(3, len(product.attributes)) + 1))
    picks = sorted(rng.choice(len(product.attributes), size=k, replace=False))
    attributes = tuple(product.attributes[j] for j in picks)
    options = tuple((dim, values[int(rng.integers(len(values)))]) for dim, values in product.options)
    above = [p for p in PRICE_POINTS if p > product.price][:3] or [int(product.price) + 1]
    price_upper = float(above[int(rng.integers(len(above)))])
    article = "an" if attributes[0][0] in "aeiou" else "a"
    wanted = " and ".join(_OPTION_PHRASES[dim].format(value) for dim, value in options)
    instruction = f"i need {article} {' '.join(attributes)} {product.type.name}"
    instruction += f" in {wanted}" if wanted else ""
    instruction += f", and price lower than {price_upper:.2f} dollars"
    return Goal(product.asin, product.type, attributes, options, price_upper, instruction)


def type_reward(goal: Goal, product: Product) -> float:
    """WebShop's r_type (`get_type_reward`), with the goal type's words standing in for spaCy's nouns.

    1.0 when the types match (WebShop: same query), the category paths share >= 2 levels,
    or > 20% of the goal type's words are in the title; else 0.5; then 0.1 when under
    10% of those words are in the title and 0.0 when none is.
    """
    wanted = set(tokenize(goal.type.name))
    title_score = len(wanted & set(tokenize(product.title))) / len(wanted)
    matched = product.type == goal.type or len(set(product.type.category) & set(goal.type.category)) >= 2
    r_type = 1.0 if matched or title_score > 0.2 else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type


def purchase_reward(goal: Goal, product: Product, chosen: dict[str, str]) -> float:
    """WebShop's reward for buying `product` with the option values `chosen`:

        r = (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[y_price <= u_price]) / (|U_att| + |U_opt| + 1) * r_type

    U: the goal's attributes and option values; Y: the product's attributes and the
    values chosen on its page (exact matches: the catalogue's words are canonical).
    """
    attribute_hits = sum(a in product.attributes for a in goal.attributes)
    chosen_values = set(chosen.values())
    option_hits = sum(value in chosen_values for _, value in goal.options)
    price_ok = product.price <= goal.price_upper
    score = (attribute_hits + option_hits + price_ok) / (len(goal.attributes) + len(goal.options) + 1)
    return score * type_reward(goal, product)
