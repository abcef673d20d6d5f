"""The answer trie: every answer's token sequences merged into one prefix tree.

An answer is reached by the canonical tokenization of any of its surface forms (the answer and its
aliases, each as written and with one leading space: `AnswerSet.surface_forms`).
A node is *terminal* for the answers whose token sequence ends there; its stop
probability is the mass of next tokens that do not extend the answer, by the stop rule of the
set's kind (`probekit.core.answers.AnswerKind`: no digit after a number, no letter or digit after
a word or letter).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
from tokenizers import decoders
from transformers.convert_slow_tokenizer import bytes_to_unicode

from probekit.core.answers import ANSWER_KINDS, AnswerSet


@dataclass
class TrieNode:
    token: int
    parent: int
    depth: int
    children: dict[int, int] = field(default_factory=dict)
    terminal_for: list[int] = field(default_factory=list)  # answer indices ending here


@dataclass
class AnswerTrie:
    """Nodes in breadth-first order; node 0 is the root (the prompt's last position)."""

    answers: AnswerSet
    nodes: list[TrieNode]
    rules: list[int]  # each answer's stop rule: the index of its kind in ANSWER_KINDS

    @classmethod
    def build(cls, answers: AnswerSet, tokenizer) -> AnswerTrie:
        """The trie of every surface form of every answer, numbered breadth-first: parents
        before children, each level contiguous, nodes of a level in the order they were made."""
        made: dict[tuple[int, ...], None] = {}  # every token prefix, in the order it was made
        ends = []
        for index in range(len(answers)):
            for tokens in answer_variants(answers, index, tokenizer):
                made.update(dict.fromkeys(tokens[:k] for k in range(1, len(tokens) + 1)))
                ends.append((tokens, index))
        order = sorted(made, key=len)  # stable: a level keeps the order its nodes were made in
        number = {(): 0} | {prefix: i + 1 for i, prefix in enumerate(order)}
        nodes = [TrieNode(token=-1, parent=-1, depth=0)]
        for prefix in order:
            nodes.append(TrieNode(prefix[-1], number[prefix[:-1]], len(prefix)))
            nodes[number[prefix[:-1]]].children[prefix[-1]] = number[prefix]
        for tokens, index in ends:
            nodes[number[tokens]].terminal_for.append(index)
        return cls(answers, nodes, [ANSWER_KINDS.index(answers.kind)] * len(answers))

    @property
    def max_depth(self) -> int:
        return max(node.depth for node in self.nodes)

    def level(self, depth: int) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.depth == depth]


def answer_variants(answers: AnswerSet, index: int, tokenizer) -> set[tuple[int, ...]]:
    """The distinct token sequences of answer `index`'s surface forms."""
    return {
        tuple(tokenizer.encode(text, add_special_tokens=False))
        for text in answers.surface_forms(index)
    }


def extension_masks(tokenizer, vocab_size: int) -> torch.Tensor:
    """Bool [kinds, vocab]: row k marks the tokens that extend an answer of `ANSWER_KINDS[k]`.

    A token that starts with a space (byte-level `Ġ`, SentencePiece `▁`) or punctuation starts a
    new word, so it extends no answer. Computed once per vocabulary and size, whichever
    tokenizer object holds it (every scorer and every reference needs the masks, and reading a
    50k vocabulary takes a noticeable fraction of a second); each call returns its own copy.
    """
    return _masks(_pieces(tokenizer), _byte_level(tokenizer), vocab_size).clone()


def _pieces(tokenizer) -> tuple[str, ...]:
    """Every vocabulary entry as the tokenizer writes it, in id order."""
    return tuple(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))


def _byte_level(tokenizer) -> bool:
    """Whether the tokenizer writes bytes as characters (GPT-2's byte-level `Ġ` for a space)."""
    return isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)


@functools.lru_cache(maxsize=4)
def _masks(pieces: tuple[str, ...], byte_level: bool, vocab_size: int) -> torch.Tensor:
    texts = list(_texts(pieces, byte_level)[:vocab_size])
    texts += [""] * (vocab_size - len(texts))  # padded embedding rows extend nothing
    return torch.tensor(
        [[kind.extends(text) for text in texts] for kind in ANSWER_KINDS], dtype=torch.bool
    ).reshape(len(ANSWER_KINDS), vocab_size)


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.lru_cache(maxsize=4)
def _texts(pieces: tuple[str, ...], byte_level: bool) -> tuple[str, ...]:
    if byte_level:
        to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
        return tuple(
            bytes(to_byte.get(c, 32) for c in piece).decode("utf-8", errors="ignore")
            if piece
            else ""
            for piece in pieces
        )
    texts = []
    for piece in pieces:
        piece = piece or ""
        byte = _BYTE_TOKEN.match(piece)
        texts.append(chr(int(byte.group(1), 16)) if byte else piece.replace("\u2581", " "))
    return tuple(texts)
