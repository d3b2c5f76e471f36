"""SearchQA: answer a question by searching a local BM25 index, then `finish[answer]`; reward is token F1."""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from ragen2.envs import ENVS
from ragen2.envs.base import TextEnv, bracket_tool
from ragen2.envs.data import DATA_DIR, read_records, require_fields
from ragen2.errors import ConfigError

BUILTIN_CORPUS = DATA_DIR / "searchqa_corpus.jsonl"
BUILTIN_QUESTIONS = DATA_DIR / "searchqa_questions.jsonl"

# Search-R1 / RAGEN SearchQA count an answer correct at F1 >= 0.3 (SPEC §7).
SUCCESS_F1 = 0.3
MAX_ARGUMENT_CHARS = 200
EXAMPLE_ACTIONS = ("search[Lake Senna]", "finish[1850]")

_ACTION = re.compile(r"(search|finish)\s*\[([^\[\]]*)\]", flags=re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    gold_ids: tuple[str, ...]  # documents holding the evidence, in the order a reader needs them


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lowercase, drop punctuation and articles, collapse spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, gold: str) -> float:
    """SQuAD token-level F1 between the normalised prediction and gold answer."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


class SearchIndex:
    """BM25 (bm25s) over `title + text` of each document; lowercase word tokens, English stopwords removed."""

    def __init__(self, docs: tuple[Document, ...]) -> None:
        import bm25s  # imported on first use, so `import ragen2.envs` stays fast
        from bm25s.stopwords import STOPWORDS_EN

        self.docs = docs
        self._stopwords = frozenset(STOPWORDS_EN)
        tokens = [self._tokens(f"{d.title} {d.text}") for d in docs]
        if not any(tokens):
            raise ConfigError("the corpus has no searchable words: every title and text is empty or stopwords")
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[Document]:
        """The top-`k` documents that share at least one word with the query, best first (ties: corpus order)."""
        tokens = [t for t in self._tokens(query) if t in self._bm25.vocab_dict]
        if not tokens:
            return []
        scores = self._bm25.get_scores(tokens)
        best = np.argsort(-scores, kind="stable")[:k]
        return [self.docs[i] for i in best if scores[i] > 0]

    def _tokens(self, text: str) -> list[str]:
        return [t for t in re.findall(r"\w+", text.lower()) if t not in self._stopwords]


def load_corpus(path: str | Path) -> tuple[Document, ...]:
    """Documents from a .jsonl/.json/.parquet file whose records have `id`, `title` and `text`."""
    docs, seen = [], set()
    for where, record in read_records(path):
        if isinstance(record.get("id"), int):
            record = {**record, "id": str(record["id"])}
        require_fields(path, where, record, ("id", "title", "text"), "corpus")
        if record["id"] in seen:
            raise ConfigError(f"{path}, {where}: duplicate document id {record['id']!r}; ids must be unique")
        seen.add(record["id"])
        docs.append(Document(record["id"], record["title"].strip(), record["text"].strip()))
    if not docs:
        raise ConfigError(f"{path} holds no documents")
    return tuple(docs)


def load_questions(path: str | Path) -> tuple[list[tuple[str, dict[str, Any]]], tuple[Document, ...]]:
    """`(where, record)` per question, and the documents of HotpotQA `context` paragraphs (id = title).

    Each record needs `question` and `answer`. Gold documents come from
    `gold_ids` (a list of corpus ids) or HotpotQA's `supporting_facts`
    (`[[title, sentence_index], ...]`, matched by title); they are resolved
    against the corpus by `_resolve`.
    """
    records, context_docs, titles = [], [], set()
    for where, record in read_records(path):
        require_fields(path, where, record, ("question", "answer"), "question")
        records.append((where, record))
        for paragraph in record.get("context") or []:
            if not (
                isinstance(paragraph, list | tuple)
                and len(paragraph) == 2
                and isinstance(paragraph[0], str)
                and isinstance(paragraph[1], list)
                and all(isinstance(sentence, str) for sentence in paragraph[1])
            ):
                raise ConfigError(f"{path}, {where}: each 'context' entry must be [title, [sentence, ...]]")
            title, sentences = paragraph
            if title not in titles:
                titles.add(title)
                context_docs.append(Document(title, title, "".join(sentences).strip()))
    if not records:
        raise ConfigError(f"{path} holds no questions")
    return records, tuple(context_docs)


def _resolve(
    path: str, records: list[tuple[str, dict[str, Any]]], docs: tuple[Document, ...]
) -> tuple[Question, ...]:
    ids, by_title = {d.id for d in docs}, {}
    for d in docs:
        by_title.setdefault(d.title, d.id)
    questions = []
    for where, record in records:
        if "gold_ids" in record:
            if not isinstance(record["gold_ids"], list):
                raise ConfigError(f"{path}, {where}: 'gold_ids' must be a list of document ids")
            gold = [str(i) for i in record["gold_ids"]]
            missing = [i for i in gold if i not in ids]
        else:
            titles = list(dict.fromkeys(fact[0] for fact in record.get("supporting_facts") or []))
            missing = [t for t in titles if t not in by_title]
            gold = [by_title[t] for t in titles if t in by_title]
        if missing:
            raise ConfigError(f"{path}, {where}: gold documents {missing} are not in the corpus")
        questions.append(Question(record["question"].strip(), record["answer"].strip(), tuple(gold)))
    return tuple(questions)


def _as_argument(text: str) -> str:
    """Text made fit for `search[...]`/`finish[...]`: no brackets, one line, within the length limit.

    Parentheses keep the words, so retrieval and the normalised F1 are unchanged.
    """
    return " ".join(text.replace("[", "(").replace("]", ")").split())[:MAX_ARGUMENT_CHARS]


def _file_key(path: str | Path | None) -> tuple[str, int] | None:
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a file: pass the path of a .jsonl, .json or .parquet file")
    return str(path.resolve()), path.stat().st_mtime_ns


@functools.lru_cache(maxsize=4)
def _load(
    corpus_key: tuple[str, int] | None, questions_key: tuple[str, int] | None
) -> tuple[tuple[Question, ...], SearchIndex]:
    """Questions and index for a pair of files, cached: the rollout builds one env per episode."""
    questions_path = questions_key[0] if questions_key else str(BUILTIN_QUESTIONS)
    records, context_docs = load_questions(questions_path)
    if corpus_key is not None:
        docs = load_corpus(corpus_key[0])
    elif questions_key is not None and context_docs:
        docs = context_docs
    else:
        docs = load_corpus(BUILTIN_CORPUS)
    return _resolve(questions_path, records, docs), SearchIndex(docs)


@ENVS.register("searchqa")
class SearchQAEnv(TextEnv):
    """Answer a question by searching a local corpus; the answer is scored by token F1.

    ## Description
    Each reset picks a question. By default: one of 50 questions over a built-in
    corpus of 60 short documents about a made-up archipelago (Vessaly), so the
    answers must be found, not remembered; 18 questions need two documents
    (e.g. the founder of a town, then that founder's ship). A user corpus
    (`corpus_path`: records with `id`, `title`, `text`) and questions
    (`questions_path`: records with `question`, `answer` and either `gold_ids`
    or HotpotQA's `supporting_facts`) load from .jsonl, .json or .parquet; a
    HotpotQA file with `context` paragraphs needs no corpus, its paragraphs are
    the corpus. Search is BM25 (`SearchIndex`). `solve()` searches the title of
    each gold document that no search has shown yet, then finishes with the
    gold answer (searching the question instead when no gold documents are
    known).

    ## Actions
    `search[query]` or `finish[answer]` (keyword case and spaces before `[`
    ignored); the text inside the brackets must be non-empty printable text of
    at most 200 characters, without brackets. Anything else is an invalid action.
    With `rollout.tool_calls=true` the same two actions are the tools
    `search(query)` and `finish(answer)`, called in the policy's native format.

    ## Observation
    `Question: ...`; after a search, the question and the top `top_k` results,
    one line each, `[1] Title: text` with the text cut to `snippet_chars`
    (`No results for "..."` when no document shares a word with the query);
    after `finish`, the answer given, the gold answer and the F1.

    ## Rewards
    `search` earns 0. `finish[answer]` earns the SQuAD token F1 between the
    answer and the gold answer (lowercase, punctuation and articles removed), in
    [0, 1]. An invalid action earns 0.

    ## Episode end
    Terminated by `finish`; truncated after `max_actions` valid actions
    without one.

    ## Info
    - `action_is_valid` (bool): the action is `search[...]` or `finish[...]` with valid text inside.
    - `success` (bool): a `finish` answer with F1 >= 0.3.
    - `exact_match` (bool): a `finish` answer equal to the gold answer after normalisation.
    - `found_gold` (bool): this search's results include a gold document.
    """

    instruction: ClassVar[str] = (
        "You are answering a question by searching an encyclopedia.\n"
        "Actions: search[query] shows the documents that best match the query; finish[answer] gives your final "
        "answer and ends the game. For example search[Lake Senna] or finish[1850].\n"
        "Search as often as you need within the action budget, then finish with a short answer copied from the "
        "documents.\n"
        "Rewards: searching earns 0; finishing earns the word overlap (F1 from 0 to 1) between your answer and "
        "the true answer.\n"
        "Answer as <think>...</think><answer>search[Lake Senna]</answer>: exactly one action, "
        "not several joined by ||."
    )
    tools: ClassVar[tuple[dict[str, Any], ...]] = (
        bracket_tool("search", "Show the encyclopedia documents that best match a query.", "query",
                     "Words to search for, e.g. Lake Senna."),
        bracket_tool("finish", "Give your final answer; this ends the game.", "answer",
                     "A short answer copied from the documents, e.g. 1850."),
    )
    tool_instruction: ClassVar[str] = (
        "You are answering a question by searching an encyclopedia with the tools search and finish.\n"
        "Search as often as you need within the action budget, then finish with a short answer copied from the "
        "documents.\n"
        "Rewards: searching earns 0; finishing earns the word overlap (F1 from 0 to 1) between your answer and "
        "the true answer.\n"
        "Think inside <think>...</think>, then call exactly one tool."
    )
    info_keys: ClassVar[frozenset[str]] = frozenset({"action_is_valid", "success", "exact_match", "found_gold"})

    def __init__(
        self,
        corpus_path: str | None = None,
        questions_path: str | None = None,
        top_k: int = 3,
        snippet_chars: int = 150,
        max_actions: int = 5,
    ) -> None:
        limits = [("top_k", top_k, 1), ("snippet_chars", snippet_chars, 20), ("max_actions", max_actions, 1)]
        for name, value, low in limits:
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}={value!r} is not allowed: use an integer >= {low}")
        if corpus_path is not None and questions_path is None:
            raise ConfigError(
                f"corpus_path={corpus_path!r} needs questions_path: "
                "the built-in questions are about the built-in corpus"
            )
        self.top_k, self.snippet_chars, self.max_actions = top_k, snippet_chars, max_actions
        self.questions, self.index = _load(_file_key(corpus_path), _file_key(questions_path))
        self._question: Question | None = None
        self._taken = 0
        self._found: set[str] = set()  # gold documents shown by this episode's searches
        self._done = False
        self._last = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        gym.Env.reset(self, seed=seed)  # seeds self.np_random; TextEnv.reset is abstract
        self._question = self.questions[int(self.np_random.integers(len(self.questions)))]
        self._taken, self._done = 0, False
        self._found = set()
        self._last = f"Question: {self._question.question}"
        return self._last, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        question = self._require_question()
        if self._done:
            raise RuntimeError("step() called after the episode ended: call reset() first")
        info = {"action_is_valid": False, "success": False, "exact_match": False, "found_gold": False}
        parsed = _ACTION.fullmatch(str(action).strip())
        argument = parsed.group(2).strip() if parsed else ""
        if not argument or len(argument) > MAX_ARGUMENT_CHARS or not argument.isprintable():
            return self._last, 0.0, False, False, info
        info["action_is_valid"] = True
        self._taken += 1
        if parsed.group(1).lower() == "finish":
            f1 = f1_score(argument, question.answer)
            info["success"] = f1 >= SUCCESS_F1
            info["exact_match"] = normalize_answer(argument) == normalize_answer(question.answer)
            self._done = True
            verdict = f'You answered "{argument}"; the answer is "{question.answer}" (F1 {f1:.2f}).'
            self._last = f"Question: {question.question}\n{verdict}"
            return self._last, f1, True, False, info
        results = self.index.search(argument, self.top_k)
        found = {doc.id for doc in results} & set(question.gold_ids)
        self._found |= found
        info["found_gold"] = bool(found)
        self._last = f"Question: {question.question}\n" + self._format_results(argument, results)
        truncated = self._taken >= self.max_actions
        self._done = truncated
        return self._last, 0.0, False, truncated, info

    def valid_actions(self) -> list[str]:
        """Example actions from the instruction: well-formed, blind to the question.

        Queries and answers are open-ended, so a random agent draws from these examples.
        """
        return list(EXAMPLE_ACTIONS)

    def solve(self) -> list[str] | None:
        """Search the title of each gold document no search has shown yet, then finish with the gold answer.

        Searches stop one action short of the budget, so the plan always ends with the finish.
        """
        question = self._require_question()
        titles = {d.id: d.title for d in self.index.docs}
        if question.gold_ids:
            queries = [titles[i] for i in question.gold_ids if i not in self._found]
        else:
            queries = [] if self._taken else [question.question]
        left = self.max_actions - self._taken
        finish = f"finish[{_as_argument(question.answer)}]"
        return [f"search[{_as_argument(q)}]" for q in queries[: max(left - 1, 0)]] + [finish]

    @property
    def question(self) -> Question:
        return self._require_question()

    def _format_results(self, query: str, results: list[Document]) -> str:
        if not results:
            return f'No results for "{query}".'
        lines = [f'Results for "{query}":']
        for rank, doc in enumerate(results, start=1):
            text = doc.text
            if len(text) > self.snippet_chars:  # cut at a word boundary
                text = text[: self.snippet_chars].rsplit(" ", 1)[0] + " ..."
            lines.append(f"[{rank}] {doc.title}: {text}")
        return "\n".join(lines)

    def _require_question(self) -> Question:
        if self._question is None:
            raise RuntimeError("SearchQAEnv has no question yet: call reset() first")
        return self._question
