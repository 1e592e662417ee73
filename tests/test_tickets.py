"""course_utils.tickets: the shipped tickets, the strict JSON answer, answer-only labels, routing and scoring."""
from __future__ import annotations

import json

import pytest
import torch

from course_utils import models as M
from course_utils import tickets as T


# --------------------------------------------------------------------------------------------
# The shipped data
# --------------------------------------------------------------------------------------------
def test_the_shipped_tickets() -> None:
    train, heldout = T.load_tickets("train"), T.load_tickets("heldout")
    assert 18 <= len(train) <= 30 and 6 <= len(heldout) <= 10
    for split in (train, heldout):
        assert {t.team for t in split} == set(T.TEAMS)  # every team in both splits
    counts = {team: sum(t.team == team for t in train) for team in T.TEAMS}
    assert len(set(counts.values())) == 1  # balanced: no team is the safe guess
    assert not {t.text for t in train} & {t.text for t in heldout}  # held out means never trained on
    assert len({t.team for t in train[:4]}) == 4  # interleaved: the loop's first steps see every team


def test_load_tickets_rejects_bad_files(monkeypatch, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    monkeypatch.setattr(T, "data_path", lambda *parts: bad)
    bad.write_text(json.dumps({"text": "hello", "team": "sales"}) + "\n")
    with pytest.raises(ValueError, match="team must be one of"):
        T.load_tickets()
    bad.write_text(json.dumps({"text": " ", "team": "billing"}) + "\n")
    with pytest.raises(ValueError, match="text"):
        T.load_tickets()
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no tickets"):
        T.load_tickets()
    with pytest.raises(ValueError, match="split"):
        T.load_tickets("test")


# --------------------------------------------------------------------------------------------
# The answer: strict JSON
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, team", [
    ('{"team": "billing"}', "billing"),
    (' {"team":"shipping"}\n', "shipping"),
    ('{"team": "sales"}', "sales"),           # valid JSON, a team that does not exist: wrong, not invalid
    ('{"team": "billing"} Thanks!', None),    # anything after the object
    ("The billing team.", None),
    ('{"team": "billing", "why": "refund"}', None),
    ('{"team": 3}', None),
    ('["billing"]', None),
    ('{"team": "billing"', None),
    ("", None),
])
def test_parse_answer_is_strict(text, team) -> None:
    assert T.parse_answer(text) == team


def test_answer_text_round_trips() -> None:
    for team in T.TEAMS:
        assert T.parse_answer(T.answer_text(team)) == team
    assert T.answer_text("billing") == '{"team": "billing"}'


def test_score_counts_valid_and_right() -> None:
    heldout = T.load_tickets("heldout")[:4]
    answers = [T.answer_text(heldout[0].team), T.answer_text("billing" if heldout[1].team != "billing" else "account"),
               "I think billing", '{"team": "sales"}']
    score = T.score(answers, heldout)
    assert (score.valid, score.right, score.total) == (3, 1, 4)
    with pytest.raises(ValueError, match="one answer per ticket"):
        T.score(answers[:2], heldout)


# --------------------------------------------------------------------------------------------
# Prompts, answer-only labels and routing, on the tiny stand-in (no chat template) and a chat template
# --------------------------------------------------------------------------------------------
def test_prompt_uses_the_chat_template_where_there_is_one(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    ticket = T.load_tickets("train")[0]
    assert not tok.chat_template
    plain = T.prompt_text(tok, ticket)
    assert plain.startswith(T.INSTRUCTION) and ticket.text in plain and plain.endswith("Answer: ")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
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
    assert example["input_ids"][0, -len(answer):].tolist() == answer
    full = torch.full_like(example["input_ids"], -100)
    full[0, -len(answer):] = torch.tensor(answer)
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
    assert T.score(answers, heldout).total == 3
    with pytest.raises(ValueError, match="tickets"):
        T.route(model, tok, [])
    with pytest.raises(ValueError, match="max_new_tokens"):
        T.route(model, tok, heldout, max_new_tokens=0)


def test_the_answer_ends_as_the_chat_template_ends_a_turn(tiny_standin) -> None:
    """transformers 5.15 converts SmolLM2's GGUF tokenizer with eos_token <|im_start|>: the template decides."""
    tok = M.load_tokenizer(tiny_standin)
    assert T.end_of_answer(tok) == (tok.eos_token or "")  # no template: the eos token
    tok.chat_template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    tok.eos_token = "<|im_start|>"  # what the 5.15 conversion says
    assert T.end_of_answer(tok) == "<|im_end|>"
