"""WebShop: find and buy the product an instruction asks for, on a text website with search."""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

import gymnasium as gym

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv, bracket_tool
from ragen2.envs.webshop_catalog import PRODUCT_TYPES, Catalog, Goal, Product, build_catalog, make_goal, purchase_reward
from ragen2.errors import ConfigError

RESULTS_PER_PAGE = 10  # WebShop's page size
# Button texts, lowercase as WebShop's text env shows them.
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE = "back to search", "next >", "< prev"
DESCRIPTION, BUY_NOW = "description", "buy now"
_ACTION = re.compile(r"\s*(search|click)\s*\[([^\[\]]*)\]\s*", flags=re.I)
_INVALID_INFO = {"action_is_valid": False, "success": False}


def parse_action(text: str) -> tuple[str, str] | None:
    """`search[words]` / `click[button]` -> (verb, argument with whitespace collapsed), else None.

    The argument may not contain brackets (no button does), so `search[a] || click[b]` is not one action.
    """
    match = _ACTION.fullmatch(text)
    if match is None:
        return None
    verb, argument = match.group(1).lower(), " ".join(match.group(2).split())
    return (verb, argument) if argument else None


class _SyntheticShop:
    """The pages of the generated shop: search, results (paged), item, description, done."""

    def __init__(self, catalog: Catalog, goal: Goal) -> None:
        self.catalog = catalog
        self.goal = goal
        self.page = "search"
        self.query = ""
        self.results: list[Product] = []
        self.page_no = 1
        self.item: Product | None = None
        self.chosen: dict[str, str] = {}
        self.reward = 0.0

    def buttons(self) -> list[str]:
        """The clickable texts on the current page, in page order."""
        if self.page == "results":
            pages = self._num_pages()
            nav = [BACK_TO_SEARCH] + [PREV_PAGE] * (self.page_no > 1) + [NEXT_PAGE] * (self.page_no < pages)
            return nav + [p.asin for p in self._page_products()]
        if self.page == "item":
            values = [v for _, vs in self.item.options for v in vs]
            return [BACK_TO_SEARCH, PREV_PAGE, *values, DESCRIPTION, BUY_NOW]
        if self.page == "description":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def act(self, verb: str, argument: str) -> bool:
        """Apply an action; False (nothing changes) when the page does not offer it."""
        if verb == "search":
            if self.page != "search":
                return False
            self.query, self.results, self.page_no, self.page = argument, self.catalog.search(argument), 1, "results"
            return True
        button = next((b for b in self.buttons() if b.lower() == argument.lower()), None)
        if button is None:
            return False
        if button == BACK_TO_SEARCH:
            self.page, self.item = "search", None
        elif button in (NEXT_PAGE, PREV_PAGE) and self.page == "results":
            self.page_no += 1 if button == NEXT_PAGE else -1
        elif button == PREV_PAGE:
            self.page = "results" if self.page == "item" else "item"
        elif button == DESCRIPTION:
            self.page = "description"
        elif button == BUY_NOW:
            self.reward = purchase_reward(self.goal, self.item, self.chosen)
            self.page = "done"
        elif self.page == "results":
            self.item, self.chosen, self.page = self.catalog.by_asin[button], {}, "item"
        else:  # an option value on the item page
            dim = next(d for d, values in self.item.options if button in values)
            self.chosen[dim] = button
        return True

    def text(self) -> str:
        head = f"Instruction: {self.goal.instruction}\n"
        if self.page == "search":
            return head + "[Search]\nAvailable actions: search[<keywords>]"
        if self.page == "done":
            chosen = ", ".join(f"{d}: {v}" for d, v in self.chosen.items()) or "no options chosen"
            return (f"You bought [{self.item.asin}] {self.item.title} ({chosen}) for ${self.item.price:.2f}. "
                    f"Reward: {self.reward:.2f}.")  # fmt: skip
        if self.page == "results":
            count = f"page {self.page_no} of {self._num_pages()}, {len(self.results)} results"
            body = f'Results for "{self.query}" ({count})'
            body += "".join(f"\n[{p.asin}] {p.title} | ${p.price:.2f}" for p in self._page_products())
        elif self.page == "item":
            body = f"[{self.item.asin}] {self.item.title}\nPrice: ${self.item.price:.2f}"
            for dim, values in self.item.options:
                body += f"\n{dim}: {' '.join(f'[{v}]' for v in values)} (chosen: {self.chosen.get(dim, 'none')})"
            body += f"\n[{DESCRIPTION}] [{BUY_NOW}]"
        else:
            body = f"[{self.item.asin}] {self.item.title}\nDescription: {self.item.description}"
        actions = ", ".join(f"click[{b}]" for b in self.buttons())
        return f"{head}{body}\nAvailable actions: {actions}"

    def solve(self) -> list[str]:
        """From the current page: reach the goal's product (searching its words when needed), choose its options, buy.

        On the goal's item page (or its description) only the options not yet chosen remain; on
        results that hold it, the plan pages to it; anywhere else it goes back to search.
        """
        if self.page == "done":
            return []
        target = self.catalog.by_asin[self.goal.asin]
        if self.item is not None and self.item.asin == target.asin and self.page in ("item", "description"):
            back = [f"click[{PREV_PAGE}]"] if self.page == "description" else []
            return back + self._choose_and_buy()
        if self.page == "results" and target in self.results:
            turn = self.results.index(target) // RESULTS_PER_PAGE + 1 - self.page_no
            paging = [f"click[{NEXT_PAGE if turn > 0 else PREV_PAGE}]"] * abs(turn)
            return paging + [f"click[{target.asin}]"] + self._choose_and_buy(fresh=True)
        plan = [] if self.page == "search" else [f"click[{BACK_TO_SEARCH}]"]
        goal_words = " ".join([*self.goal.attributes, self.goal.type.name, *(v for _, v in self.goal.options)])
        for query in (goal_words, target.title):  # the title finds it when the goal's words rank it below 50
            asins = [p.asin for p in self.catalog.search(query)]
            if target.asin in asins:
                break
        rank = asins.index(target.asin)
        plan += [f"search[{query}]"] + [f"click[{NEXT_PAGE}]"] * (rank // RESULTS_PER_PAGE) + [f"click[{target.asin}]"]
        return plan + self._choose_and_buy(fresh=True)

    def _choose_and_buy(self, fresh: bool = False) -> list[str]:
        """Click each goal option not chosen yet (all of them on a freshly opened item page), then buy."""
        chosen = {} if fresh else self.chosen
        return [f"click[{value}]" for dim, value in self.goal.options if chosen.get(dim) != value] + [f"click[{BUY_NOW}]"]

    def search_page(self) -> bool:
        return self.page == "search"

    def example_searches(self) -> list[str]:
        return [ptype.name for ptype in PRODUCT_TYPES]

    def _num_pages(self) -> int:
        return max(1, math.ceil(len(self.results) / RESULTS_PER_PAGE))

    def _page_products(self) -> list[Product]:
        start = (self.page_no - 1) * RESULTS_PER_PAGE
        return self.results[start : start + RESULTS_PER_PAGE]


class _OriginalShop:
    """Adapter over princeton-nlp/WebShop's `WebAgentTextEnv` (text mode), for `backend="original"`.

    Written against WebShop's documented text-env API (`reset(session)`, `step(action)
    -> (obs, reward, done, info)`, `get_available_actions()` -> `has_search_bar`,
    `clickables`, `instruction_text`) and kept thin; it is not exercised by this
    project's tests, which run where WebShop and its data are not installed.
    """

    def __init__(self, num_products: int | None, human_goals: bool) -> None:
        try:
            from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
        except ImportError as e:
            raise ConfigError(
                "backend='original' needs WebShop installed with its product data (web_agent_site importable; "
                "see github.com/princeton-nlp/WebShop setup.sh); use backend='synthetic' otherwise"
            ) from e
        self.env = WebAgentTextEnv(observation_mode="text", num_products=num_products, human_goals=human_goals)
        self.obs = ""
        self.reward = 0.0
        self.page = "search"

    def reset(self, seed: int) -> None:
        self.obs, _ = self.env.reset(session=seed % len(self.env.server.goals))
        self.page, self.reward = "search", 0.0

    def buttons(self) -> list[str]:
        available = self.env.get_available_actions()
        return [c for c in available["clickables"] if c != "search"]

    def act(self, verb: str, argument: str) -> bool:
        available = self.env.get_available_actions()
        if verb == "search" and not available["has_search_bar"]:
            return False
        if verb == "click" and argument.lower() not in self.buttons():
            return False
        self.obs, reward, done, _ = self.env.step(f"{verb}[{argument}]")
        self.reward = float(reward)
        self.page = "done" if done else "other"
        return True

    def text(self) -> str:
        if self.page == "done":
            return f"{self.obs}\nReward: {self.reward:.2f}."
        if self.env.get_available_actions()["has_search_bar"]:
            return f"{self.obs}\nAvailable actions: search[<keywords>]"
        return f"{self.obs}\nAvailable actions: " + ", ".join(f"click[{b}]" for b in self.buttons())

    def search_page(self) -> bool:
        return bool(self.env.get_available_actions()["has_search_bar"])

    def example_searches(self) -> list[str]:
        return [self.env.instruction_text]


@ENVS.register("webshop")
class WebShopEnv(TextEnv):
    """Find and buy the product an instruction asks for, on a small text website with a search engine.

    ## Description
    A WebShop-style task (Yao et al., 2022) on a generated catalogue
    (`webshop_catalog.build_catalog`): `num_products` products (default 500) of 16
    types in 6 departments (clothing, electronics, home, bags, beauty, grocery), each
    with a brand, 2-4 attributes (e.g. "slim fit", "noise cancelling", "sulfate
    free"), option dimensions (color, size, model, capacity, scent, flavor) and a
    price; the catalogue depends only on `catalog_seed`. Each reset draws a goal from
    one product (`make_goal`): 1-3 of its attributes, one value per option dimension
    and a price bound above its price, phrased as WebShop's synthetic instructions
    ("i need a slim fit cotton t-shirt in red color and size m, and price lower than
    30.00 dollars"). Search is BM25 (bm25s) over title, type, category,
    attributes and option values; the top 50 results are shown 10 per page.
    `solve()` searches the goal's words, pages to the goal's product (it always
    exists), chooses the goal's options and buys: reward 1. With
    `backend="original"` the pages come from WebShop itself (`web_agent_site` and its
    data must be installed; a ConfigError says so otherwise) and `solve()` is None.

    ## Actions
    `search[keywords]` on the search page; `click[button]` for a button of the
    current page: `back to search`, `next >`, `< prev` (previous results page, or
    back from an item or its description), a product id such as `B0K7TQ2MZX`, an
    option value such as `red` or `m`, `description`, `buy now`. Buttons match
    ignoring case and extra spaces. Anything else, or a button not on the page, is
    invalid. `valid_actions()` lists the page's clicks, or on the search page one
    search per product type (`search[t-shirt]`, `search[headphones]`, ...).
    With `rollout.tool_calls=true` the two actions are the tools `search(keywords)`
    and `click(button)`, called in the policy's native format.

    ## Observation
    Every page starts with `Instruction: ...` and ends with `Available actions: ...`
    listing what can be done. Results pages list `[id] title | $price`; item pages
    show the title, price, each option dimension's values with the current choice,
    and the description and buy buttons. After buying: what was bought and the reward.

    ## Rewards
    0 until the purchase; buying gives WebShop's score
    `(attributes matched + options matched + [price <= bound]) / (goal attributes +
    goal options + 1) * r_type` (`webshop_catalog.purchase_reward`), r_type being 1
    for a product of the goal's type (WebShop's type rule, see `type_reward`).

    ## Episode end
    Terminated by `click[buy now]`. Truncated after `max_actions` valid actions
    (default 15) without a purchase. Invalid actions do not count.

    ## Info
    - `action_is_valid` (bool): the action was available on the page.
    - `success` (bool): the purchase scored 1 (every attribute, option, the price and the type matched).
    """

    instruction: ClassVar[str] = (
        "You are shopping on a website. Find and buy the product that matches the instruction.\n"
        "Actions: search[keywords] on the search page; click[button] for a button of the current page, "
        "e.g. click[next >], click[< prev], click[back to search], click[B0K7TQ2MZX] (a product id), "
        "click[red] (an option), click[description], click[buy now]. Each page lists its available actions.\n"
        "Choose every option the instruction asks for before you buy.\n"
        "Reward: buying scores the share of requested attributes, options and price bound that the purchase "
        "meets (0 for a product of another type); 1 is a perfect match.\n"
        "Answer as <think>...</think><answer>Action1 || Action2</answer>: one or more actions separated by ||; "
        "each action acts on the page the previous one led to."
    )
    tools: ClassVar[tuple[dict[str, Any], ...]] = (
        bracket_tool("search", "Search the shop (on the search page).", "keywords", "Words describing the product."),
        bracket_tool("click", "Click a button of the current page; each page lists its buttons.", "button",
                     "The button's text: next >, < prev, back to search, a product id such as B0K7TQ2MZX, an option "
                     "such as red, description, buy now."),
    )
    tool_instruction: ClassVar[str] = (
        "You are shopping on a website with the tools search and click. Find and buy the product that matches the "
        "instruction.\n"
        "Choose every option the instruction asks for before you buy.\n"
        "Reward: buying scores the share of requested attributes, options and price bound that the purchase "
        "meets (0 for a product of another type); 1 is a perfect match.\n"
        "Think inside <think>...</think>, then call one or more tools; each acts on the page the previous one led to."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success"})

    def __init__(
        self,
        num_products: int = 500,
        catalog_seed: int = 0,
        max_actions: int = 15,
        backend: str = "synthetic",
        human_goals: bool = False,
    ) -> None:
        if backend not in ("synthetic", "original"):
            raise ConfigError(f"backend={backend!r} is not allowed: use 'synthetic' or 'original'")
        if num_products < len(PRODUCT_TYPES):
            raise ConfigError(
                f"num_products={num_products} is not allowed: use at least {len(PRODUCT_TYPES)} (one per product type)"
            )
        if max_actions < 1:
            raise ConfigError(f"max_actions={max_actions} is not allowed: use an integer >= 1")
        self.max_actions = max_actions
        self.backend = backend
        self._catalog = build_catalog(num_products, catalog_seed) if backend == "synthetic" else None
        self._original = _OriginalShop(num_products, human_goals) if backend == "original" else None
        self._shop: Any = None
        self._actions_taken = 0
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        if self._original is not None:
            self._original.reset(int(self.np_random.integers(2**31)) if seed is None else seed)
            self._shop = self._original
        else:
            self._shop = _SyntheticShop(self._catalog, make_goal(self._catalog, self.np_random))
        self._actions_taken = 0
        self._done = False
        return self._shop.text(), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        shop = self._require_running()
        parsed = parse_action(str(action))
        if parsed is None or not shop.act(*parsed):
            return shop.text(), 0.0, False, False, dict(_INVALID_INFO)
        self._actions_taken += 1
        terminated = shop.page == "done"
        reward = shop.reward if terminated else 0.0
        truncated = not terminated and self._actions_taken >= self.max_actions
        self._done = terminated or truncated
        info = {"action_is_valid": True, "success": terminated and reward == 1.0}
        return shop.text(), reward, terminated, truncated, info

    def valid_actions(self) -> list[str]:
        shop = self._require_shop()
        if shop.search_page():
            return [f"search[{words}]" for words in shop.example_searches()]
        return [f"click[{b}]" for b in shop.buttons()]

    def solve(self) -> list[str] | None:
        """The oracle plan from the current page (synthetic backend only)."""
        shop = self._require_shop()
        return None if self._original is not None else shop.solve()

    @property
    def goal(self) -> Goal:
        """The current goal (synthetic backend)."""
        return self._require_shop().goal

    def _require_shop(self) -> Any:
        if self._shop is None:
            raise RuntimeError("WebShopEnv has no episode yet: call reset() first")
        return self._shop

    def _require_running(self) -> Any:
        shop = self._require_shop()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        return shop
