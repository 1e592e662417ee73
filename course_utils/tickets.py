"""The ticket-routing task of notebook 01b (04's project): read a support ticket, answer with strict JSON naming a team.

A small dataset written for the course ships in ``data/tickets``: ``train.jsonl`` (training tickets) and
``heldout.jsonl`` (tickets the model never trains on, to test it), one ``{"text": ..., "team": ...}`` per line,
with the teams of :data:`TEAMS`. The instruction asks for ``{"team": "billing"}`` and nothing else;
:func:`parse_answer` is strict about that format, while :func:`team_named` reads the team from any answer, so a
model that answers in prose still gets a fair score for the team.

The pieces QLoRA needs, kept out of the notebook: the chat prompt (:func:`prompt_text`), a training example
whose loss covers the answer only (:func:`training_example`), greedy answers for many tickets at once
(:func:`route`), the two counts the lesson reports (:func:`score`), and what those counts are compared with:
the most common training team (:func:`majority_team`), chance (:func:`chance_tail`, :func:`margin_over_chance`)
and a 95 % interval (:func:`wilson_interval`). Nothing heavy is imported here.
"""

import json
import math
import re
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from course_utils import checks, data_path

if TYPE_CHECKING:
    import torch

#: The four teams a ticket can go to, in the order the instructions list them.
TEAMS = ("billing", "technical", "account", "shipping")
#: The instruction the model reads before every ticket (the system message of the chat template).
INSTRUCTION = (
    "Route the customer's support ticket to one team: billing, technical, account or shipping. "
    'Answer with JSON only, in the form {"team": "<team>"}.'
)
#: A team's name as a whole word, in any case: how :func:`team_named` finds the teams an answer names.
_TEAM_WORD = re.compile(r"\b(" + "|".join(TEAMS) + r")\b", re.IGNORECASE)


class Ticket(NamedTuple):
    """One support ticket and the team that should handle it."""

    text: str
    team: str


def load_tickets(split: str = "train") -> list[Ticket]:
    """The shipped tickets of ``split`` ("train" or "heldout"), from ``data/tickets/<split>.jsonl``."""
    checks.choice(split, "split", ("train", "heldout"))
    lines = data_path("tickets", f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [Ticket(row["text"].strip(), row["team"]) for row in rows]


def answer_text(team: str) -> str:
    """The one right answer for ``team`` (one of :data:`TEAMS`), as strict JSON: ``{"team": "billing"}``."""
    return json.dumps({"team": checks.choice(team, "team", TEAMS)})


def parse_answer(text: str) -> str | None:
    """The team named by a strict JSON answer ``{"team": "..."}``, or None when ``text`` is anything else.

    Strict: the whole answer (spaces around it aside) must be one JSON object with the single key "team" and a
    string value. A valid answer may still name a team that does not exist: that is a wrong team, not bad JSON.
    """
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    if isinstance(value, dict) and list(value) == ["team"] and isinstance(value["team"], str):
        return value["team"]
    return None


def team_named(text: str) -> str | None:
    """The one team an answer names, or None: the "team" value of a valid JSON answer, else the text itself.

    Fair to an answer in prose ("This is one for the billing team.") and strict about doubt: an answer that names
    no team, or more than one ("billing or account"), names none. Teams count as whole words, in any case.
    """
    parsed = parse_answer(text)
    named = {word.lower() for word in _TEAM_WORD.findall(text if parsed is None else parsed)}
    return named.pop() if len(named) == 1 else None


def prompt_text(tokenizer: Any, ticket: Ticket) -> str:
    """What the model reads before it answers: the instruction, the ticket, and the assistant's turn opened.

    With the tokenizer's chat template where it has one (SmolLM2-135M-Instruct's), else a plain two-line layout
    (the stand-in's offline tokenizer has no template).
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": ticket.text}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return f"{INSTRUCTION}\nTicket: {ticket.text}\nAnswer: "


def end_of_answer(tokenizer: Any) -> str:
    """What closes an answer: the chat template's end of an assistant turn (SmolLM2: ``<|im_end|>``), else eos.

    Read from the template, not from ``eos_token``: a tokenizer converted from GGUF by some transformers
    versions (5.15) names ``<|im_start|>`` as its eos token, and a model trained to end with that would run on.
    """
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.eos_token or ""
    marker = "ANSWER-END-MARKER"
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
    end = tokenizer.apply_chat_template(turn, tokenize=False).rpartition(marker)[2].strip()
    return end or tokenizer.eos_token or ""


def training_example(tokenizer: Any, ticket: Ticket, device: "torch.device | str | None" = None) -> dict[str, Any]:
    """One training example: the prompt, then the answer and the end-of-turn token; the loss sees the answer only.

    The prompt's positions get label -100 (ignored by the loss), so the adapter learns what to answer, not how
    tickets read. Returns ``input_ids`` and ``attention_mask`` of shape (1, length), and ``labels`` and
    ``logits_to_keep`` for the last positions only: the same loss as full-length labels, without computing the
    vocabulary-sized logits of every prompt position (a large part of a CPU step).
    """
    import torch

    checks.instance(ticket, "ticket", Ticket, "a Ticket (see load_tickets)")
    prompt = tokenizer(prompt_text(tokenizer, ticket), add_special_tokens=False)["input_ids"]
    answer = tokenizer(answer_text(ticket.team) + end_of_answer(tokenizer), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + answer], device=device)
    # Only the last len(answer) + 1 positions predict an answer token: the model computes the vocabulary-sized
    # logits for those alone (logits_to_keep), and the labels are cut to match: the loss shifts them by one, so
    # they are the last prompt position's -100 (never read), then the answer.
    keep = len(answer) + 1
    labels = torch.tensor([[-100] + answer], device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "logits_to_keep": keep}


def route(model: Any, tokenizer: Any, tickets: Sequence[Ticket], max_new_tokens: int = 20) -> list[str]:
    """The model's greedy answers to ``tickets``, generated together (left padding), prompts left out."""
    import torch

    from course_utils.quiet import quiet_libraries

    # A str or a single Ticket fails this too: their items are strings.
    if not tickets or not all(isinstance(t, Ticket) for t in tickets):
        raise ValueError("tickets must be a non-empty list of Ticket (see load_tickets)")
    prompts = [tokenizer(prompt_text(tokenizer, t), add_special_tokens=False)["input_ids"] for t in tickets]
    # Padded on the left, as generation continues each prompt at its right end (eos pads where there is no pad).
    pad = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=ids.device)
    # Stop at the end of an answer as training wrote it, and at whatever the model's own config says.
    stops = tokenizer(end_of_answer(tokenizer), add_special_tokens=False)["input_ids"][-1:]
    own = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stops += [own] if isinstance(own, int) else list(own or [])
    was_training = model.training
    model.eval()
    eos = sorted(set(stops)) or None
    with quiet_libraries(), torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, eos_token_id=eos
        )
    model.train(was_training)
    return [tokenizer.decode(row, skip_special_tokens=True).strip() for row in out[:, width:]]


class Score(NamedTuple):
    """How many answers were valid JSON, and how many named the right team (:func:`team_named`), of ``total``."""

    valid: int
    right: int
    total: int


def score(answers: Sequence[str], tickets: Sequence[Ticket]) -> Score:
    """Count the valid JSON answers (:func:`parse_answer`) and the right teams (:func:`team_named`) of ``answers``."""
    if len(answers) != len(tickets) or not tickets:
        raise ValueError(f"need one answer per ticket, got {len(answers)} answers for {len(tickets)} tickets")
    if not all(isinstance(a, str) for a in answers):
        raise TypeError("answers must be strings (what route returns)")
    valid = sum(parse_answer(a) is not None for a in answers)
    return Score(valid, sum(team_named(a) == t.team for a, t in zip(answers, tickets)), len(tickets))


def majority_team(tickets: Sequence[Ticket]) -> str:
    """The most common team of ``tickets`` (a baseline always answers it); on a tie, the first in :data:`TEAMS`."""
    return max(TEAMS, key=[t.team for t in tickets].count)


def chance_tail(total: int, right: int) -> float:
    """The chance that a guesser, one chance in four per ticket, names the right team on ``right`` of ``total`` or more.

    The upper tail of the binomial distribution: the sum over k >= ``right`` of C(total, k) p^k (1 - p)^(total - k),
    with p = 1 / len(TEAMS).
    """
    p = 1 / len(TEAMS)
    return sum(math.comb(total, k) * p**k * (1 - p) ** (total - k) for k in range(right, total + 1))


def margin_over_chance(total: int) -> int:
    """k of the lesson's check "right team on at least k more of ``total`` tickets than every baseline".

    Why k: a model that guesses a team at random is right on Binomial(total, 1/4) tickets, total/4 on average,
    which is what always answering one team scores on a balanced held-out set. k is the smallest margin above
    total/4 that such a guesser reaches with a chance of 1 % or less (:func:`chance_tail`). On 48 tickets
    at 1 %: a guesser reaches 12 + 7 = 19 with a chance of 1.8 %, 12 + 8 = 20 with 0.8 %, so k = 8. A smaller
    margin, say "more than before", a guesser passes often: 13 or more of 48 with a chance of 42 %.
    """
    base = math.ceil(checks.integer(total, "total", 1) / len(TEAMS))
    # The first k that passes the level; at the latest, every ticket right (base + k == total).
    return next(k for k in range(total - base + 1) if base + k == total or chance_tail(total, base + k) <= 0.01)


def wilson_interval(successes: int, total: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of the share ``successes / total`` (0 to ``total``), as two shares in [0, 1].

    Unlike share ± z·sqrt(share (1 - share) / total), it stays inside [0, 1] and is not zero wide at 0 or total.
    """
    z = 1.96  # the normal quantile of a 95 % interval
    share, z2 = successes / total, z**2 / total
    centre = (share + z2 / 2) / (1 + z2)
    half = z * math.sqrt(share * (1 - share) / total + z2 / (4 * total)) / (1 + z2)
    return max(0.0, centre - half), min(1.0, centre + half)
