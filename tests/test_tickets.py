"""course_utils.tickets: the shipped tickets, the strict JSON answer, answer-only labels, routing, scoring,
and what the counts are compared with (the baselines, chance, a 95 % interval)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from course_utils import models as M
from course_utils import tickets as T


# --------------------------------------------------------------------------------------------
# The shipped data
# --------------------------------------------------------------------------------------------
def test_the_shipped_tickets() -> None:
    train, heldout = T.load_tickets("train"), T.load_tickets("heldout")
    assert len(heldout) >= 40 and len(train) >= 40  # enough to tell a trained model from a lucky guesser
    for split in (train, heldout):
        counts = [sum(t.team == team for t in split) for team in T.TEAMS]
        assert sum(counts) == len(split) and len(set(counts)) == 1, counts  # every team known; balanced
        assert all(t.text and t.text == t.text.strip() for t in split)
        assert len({t.text.lower() for t in split}) == len(split)  # no ticket twice
    assert len({t.team for t in train[:4]}) == 4  # interleaved: the loop's first steps see every team


#: Word-set overlap (Jaccard: shared words / all words of the pair) from which two tickets count as near-copies.
NEAR_COPY = 0.5


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", text.lower()))


def _overlap(a: str, b: str) -> float:
    return len(_words(a) & _words(b)) / len(_words(a) | _words(b))


def test_the_near_copy_measure_catches_a_reworded_ticket() -> None:
    original = "The app crashes every time I open the settings page on my Android phone."
    assert _overlap(original, "The app crashes each time I open the settings page on my Android tablet.") >= NEAR_COPY
    assert _overlap(original, "Please delete my account and all the data you keep about me.") < NEAR_COPY


def test_held_out_tickets_are_not_near_copies_of_training_tickets() -> None:
    """Held out means never trained on, not even reworded: a near-copy would test memory, not routing."""
    train, heldout = T.load_tickets("train"), T.load_tickets("heldout")
    copies = [(h.text, t.text) for h in heldout for t in train if _overlap(h.text, t.text) >= NEAR_COPY]
    assert not copies
    pairs = [(a.text, b.text) for i, a in enumerate(heldout) for b in heldout[i + 1 :]]
    assert not [pair for pair in pairs if _overlap(*pair) >= NEAR_COPY]  # and varied among themselves


def test_load_tickets_reads_only_the_two_splits() -> None:
    with pytest.raises(ValueError, match="split"):
        T.load_tickets("test")


# --------------------------------------------------------------------------------------------
# The answer: strict JSON
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, team",
    [
        ('{"team": "billing"}', "billing"),
        (' {"team":"shipping"}\n', "shipping"),
        ('{"team": "sales"}', "sales"),  # valid JSON, a team that does not exist: wrong, not invalid
        ('{"team": "billing"} Thanks!', None),  # anything after the object
        ("The billing team.", None),
        ('{"team": "billing", "why": "refund"}', None),
        ('{"team": 3}', None),
        ('["billing"]', None),
        ('{"team": "billing"', None),
        ("", None),
    ],
)
def test_parse_answer_is_strict(text, team) -> None:
    assert T.parse_answer(text) == team


def test_answer_text_round_trips() -> None:
    for team in T.TEAMS:
        assert T.parse_answer(T.answer_text(team)) == team
    assert T.answer_text("billing") == '{"team": "billing"}'


@pytest.mark.parametrize(
    "text, team",
    [
        ('{"team": "billing"}', "billing"),
        ('{"team": "Technical"}', "technical"),  # valid JSON, any case
        ('{"team": "technical support"}', "technical"),  # the one team its value names
        ('{"team": "<team>"}', None),  # the instruction's placeholder names no team
        ('{"team": "billing or account"}', None),  # two teams: no answer
        ("This one is for the Shipping team.", "shipping"),  # prose that names one team counts for the team
        ("billing, technical, account or shipping", None),  # the instruction echoed: every team, so none
        ('{"department": "account"}', "account"),  # not the asked-for JSON, but one team named
        ("Our accountant will call you.", None),  # whole words only
        ("", None),
    ],
)
def test_team_named_reads_json_and_prose_fairly(text, team) -> None:
    assert T.team_named(text) == team


def test_score_counts_valid_and_right() -> None:
    heldout = T.load_tickets("heldout")[:5]
    wrong = next(team for team in T.TEAMS if team != heldout[1].team)
    answers = [
        T.answer_text(heldout[0].team),  # valid, right
        T.answer_text(wrong),  # valid, wrong
        f"Send it to {heldout[2].team}.",  # prose: not valid, but right
        '{"team": "sales"}',  # valid, a team that does not exist
        "I am not sure.",
    ]  # neither
    assert T.score(answers, heldout) == (3, 2, 5)
    with pytest.raises(ValueError, match="one answer per ticket"):
        T.score(answers[:2], heldout)
    with pytest.raises(TypeError, match="strings"):
        T.score([None] * 5, heldout)  # type: ignore[list-item]


def _next_team(team: str) -> str:
    return T.TEAMS[(T.TEAMS.index(team) + 1) % len(T.TEAMS)]


def test_score_judges_each_answer_against_its_own_ticket() -> None:
    """A scorer right on every third ticket and wrong on the others scores exactly that; so do the baselines."""
    heldout = T.load_tickets("heldout")
    n = len(heldout)
    answers = [T.answer_text(t.team if i % 3 == 0 else _next_team(t.team)) for i, t in enumerate(heldout)]
    score = T.score(answers, heldout)
    right = len(range(0, n, 3))
    assert (score.valid, score.right, score.total - score.right) == (n, right, n - right)
    # always one team: right exactly on that team's tickets (a quarter of the balanced held-out set)
    for team in T.TEAMS:
        assert T.score([T.answer_text(team)] * n, heldout).right == n // 4
    # answers in prose count for the team, not for the format
    prose = [f"That is one for {t.team}." for t in heldout]
    assert T.score(prose, heldout) == (0, n, n)


def test_the_instruction_asks_for_the_json_answer() -> None:
    """The untrained model gets a fair try: it is told the format the trained one learns."""
    assert '{"team": "<team>"}' in T.INSTRUCTION and "JSON" in T.INSTRUCTION
    assert all(team in T.INSTRUCTION for team in T.TEAMS)


# --------------------------------------------------------------------------------------------
# What the counts are compared with: the majority team, chance, a 95 % interval
# --------------------------------------------------------------------------------------------
def _ticket(team: str) -> T.Ticket:
    return T.Ticket("a ticket", team)


def test_majority_team() -> None:
    assert T.majority_team([_ticket(t) for t in ("shipping", "account", "shipping")]) == "shipping"
    assert T.majority_team([_ticket(t) for t in ("shipping", "account")]) == "account"  # a tie: first in TEAMS
    assert T.majority_team(T.load_tickets("train")) == "billing"  # balanced: every team ties


def test_chance_tail_is_the_binomial_upper_tail() -> None:
    assert T.chance_tail(1, 1) == pytest.approx(0.25) and T.chance_tail(2, 2) == pytest.approx(1 / 16)
    assert T.chance_tail(2, 1) == pytest.approx(1 - 0.75**2) and T.chance_tail(48, 0) == pytest.approx(1.0)
    # against a simulation-free reference: the probability mass function summed the other way
    below = sum(math.comb(48, k) * 0.25**k * 0.75 ** (48 - k) for k in range(20))
    assert T.chance_tail(48, 20) == pytest.approx(1 - below)


def test_margin_over_chance_is_the_smallest_safe_margin() -> None:
    """The figures its docstring gives, and the definition: k passes the level, k - 1 does not."""
    assert T.chance_tail(48, 19) == pytest.approx(0.0184, abs=1e-4)
    assert T.chance_tail(48, 20) == pytest.approx(0.0084, abs=1e-4)
    assert T.chance_tail(48, 13) == pytest.approx(0.42, abs=0.005)
    assert T.margin_over_chance(48) == 8
    for total in (8, 40, 48, 100):
        k, base = T.margin_over_chance(total), math.ceil(total / 4)
        assert T.chance_tail(total, base + k) <= 0.01 < T.chance_tail(total, base + k - 1)


def test_wilson_interval() -> None:
    low, high = T.wilson_interval(5, 8)  # worked by hand: centre 0.5845, half-width 0.2787
    assert (round(low, 3), round(high, 3)) == (0.306, 0.863)
    low, high = T.wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(1.96**2 / (10 + 1.96**2))  # z² / (n + z²)
    low, high = T.wilson_interval(10, 10)
    assert high == pytest.approx(1.0) and low == pytest.approx(10 / (10 + 1.96**2))
    a, b = T.wilson_interval(12, 48), T.wilson_interval(36, 48)
    assert a[0] == pytest.approx(1 - b[1]) and a[1] == pytest.approx(1 - b[0])  # symmetric
    widths = [high - low for low, high in (T.wilson_interval(7, 8), T.wilson_interval(42, 48))]
    assert widths[1] < widths[0]  # the same share on more tickets: narrower


# --------------------------------------------------------------------------------------------
# Prompts, answer-only labels and routing, on the tiny stand-in (no chat template) and a chat template
# --------------------------------------------------------------------------------------------
def test_prompt_uses_the_chat_template_where_there_is_one(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    ticket = T.load_tickets("train")[0]
    assert not tok.chat_template
    plain = T.prompt_text(tok, ticket)
    assert plain.startswith(T.INSTRUCTION) and ticket.text in plain and plain.endswith("Answer: ")
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    chat = T.prompt_text(tok, ticket)
    assert chat == f"<system>{T.INSTRUCTION}<user>{ticket.text}<assistant>"


def test_training_example_labels_the_answer_only(tiny_standin) -> None:
    """Answer-only labels, cut to the last positions with logits_to_keep: the same loss as full-length labels."""
    tok = M.load_tokenizer(tiny_standin)
    model = M.load_model(tiny_standin, 16, device="cpu")
    ticket = T.load_tickets("train")[0]
    example = T.training_example(tok, ticket)
    answer = tok(T.answer_text(ticket.team) + tok.eos_token, add_special_tokens=False)["input_ids"]
    keep = example["logits_to_keep"]
    assert keep == len(answer) + 1 and example["labels"].shape == (1, keep)
    assert example["labels"][0, 0] == -100 and example["labels"][0, 1:].tolist() == answer
    assert example["input_ids"][0, -len(answer) :].tolist() == answer
    full = torch.full_like(example["input_ids"], -100)
    full[0, -len(answer) :] = torch.tensor(answer)
    with torch.no_grad():
        cut = model(**example).loss
        reference = model(input_ids=example["input_ids"], attention_mask=example["attention_mask"], labels=full).loss
    assert torch.allclose(cut.float(), reference.float(), rtol=1e-3)
    with pytest.raises(TypeError, match="Ticket"):
        T.training_example(tok, "a ticket")  # type: ignore[arg-type]


def test_route_answers_every_ticket_and_keeps_the_tokenizer(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    model = M.load_model(tiny_standin, 16, device="cpu")
    heldout = T.load_tickets("heldout")[:3]
    model.train()
    answers = T.route(model, tok, heldout, max_new_tokens=3)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    assert tok.padding_side == "right" and model.training  # left as they were
    assert tok.pad_token == M.load_tokenizer(tiny_standin).pad_token  # pad token too
    with pytest.raises(ValueError, match="tickets"):
        T.route(model, tok, [])


def test_the_answer_ends_as_the_chat_template_ends_a_turn(tiny_standin) -> None:
    """transformers 5.15 converts SmolLM2's GGUF tokenizer with eos_token <|im_start|>: the template decides."""
    tok = M.load_tokenizer(tiny_standin)
    assert T.end_of_answer(tok) == (tok.eos_token or "")  # no template: the eos token
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tok.eos_token = "<|im_start|>"  # what the 5.15 conversion says
    assert T.end_of_answer(tok) == "<|im_end|>"
