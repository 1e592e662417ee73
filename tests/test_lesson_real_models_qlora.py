"""course_utils.lessons.real_models_qlora: notebook 01b's two exercises, right, unanswered and typical slips."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_utils.architecture import lora_adapter_params
from course_utils.lessons import real_models_qlora as Q
from course_utils.footprint import computed_sizes
from course_utils.models import QWEN3_CONFIG
from course_utils.standin import STANDIN_CONFIG

SOURCE = Path(__file__).resolve().parents[1] / "notebooks" / "src" / "01b_real_models_qlora.py"


# --------------------------------------------------------------------------------------------
# Exercise 1: Qwen3-4B-Instruct-2507 in 4 bits
# --------------------------------------------------------------------------------------------
def test_size_answer_comes_from_the_course_counter() -> None:
    facts = Q.size_facts()
    sizes = computed_sizes(QWEN3_CONFIG)
    assert Q.SIZE_MODEL == QWEN3_CONFIG and facts["bytes4"] == sizes.bytes4
    assert facts["params"] == facts["linears"] + facts["embedding"] + facts["other_16bit"]
    # the 4-bit footprint is the arithmetic of the worked solution, plus a few hundred bytes of buffers
    by_hand = facts["linears"] // 2 + 2 * (facts["embedding"] + facts["other_16bit"])
    assert 0 <= facts["bytes4"] - by_hand < 1024


def test_the_givens_in_the_notebook_are_the_counted_ones() -> None:
    """The exercise text retypes the parts; they must be the ones the meta device counts."""
    facts = Q.size_facts()
    text = SOURCE.read_text(encoding="utf-8")
    task = text[text.index("### Your turn: a 4-bit size by hand"):text.index("check_four_bit_size(answer_gb)")]
    for key in ("params", "linears", "embedding", "other_16bit"):
        assert f"{facts[key]:,}" in task, key
    assert re.search(r"≈ \*\*2\.59 GB\*\*", text)


def test_size_right_answers() -> None:
    assert Q.check_four_bit_size(2.59).correct
    assert Q.check_four_bit_size(Q.size_facts()["bytes4"] / 1e9).correct
    assert Q.check_four_bit_size(2.6).correct  # within 1 %


@pytest.mark.parametrize("placeholder", [..., None])
def test_size_unanswered(placeholder) -> None:
    feedback = Q.check_four_bit_size(placeholder)
    assert not feedback.correct and not feedback.answered and str(feedback).startswith("Not answered yet")


@pytest.mark.parametrize("answer, hint", [
    (2.01, "stay 16-bit"),           # every parameter at 4 bits
    (8.04, "16-bit size"),           # 2 bytes each
    (3.37, "tied"),                  # the embedding counted twice
    (16.09, "half a byte"),          # 4 bytes per weight
    (2.42, "GiB"),                   # 2.59 GB in GiB
    (2.82, "NF4 scales"),            # scales included
])
def test_size_typical_slips_get_their_hint(answer, hint) -> None:
    feedback = Q.check_four_bit_size(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


@pytest.mark.parametrize("answer", [5.0, "2.59", float("nan"), True])
def test_size_other_wrong_answers(answer) -> None:
    feedback = Q.check_four_bit_size(answer)
    assert not feedback.correct and feedback.answered and feedback.hint


# --------------------------------------------------------------------------------------------
# Exercise 2: LoRA rank 8 on q_proj and v_proj of SmolLM2-135M
# --------------------------------------------------------------------------------------------
def test_lora_answer_comes_from_the_course_counter() -> None:
    assert Q.LORA_MODEL == STANDIN_CONFIG
    assert lora_adapter_params(STANDIN_CONFIG, 8, ("q_proj", "v_proj")) == 460_800
    assert Q.check_lora_count(460_800).correct


def test_lora_right_answer() -> None:
    assert Q.check_lora_count(460_800).correct
    assert Q.check_lora_count(30 * 8 * (576 + 576 + 576 + 192)).correct  # an expression is fine
    assert not Q.check_lora_count(460_801).correct  # an exact count


@pytest.mark.parametrize("placeholder", [..., None])
def test_lora_unanswered(placeholder) -> None:
    feedback = Q.check_lora_count(placeholder)
    assert not feedback.answered and "Not answered yet" in str(feedback)


@pytest.mark.parametrize("answer, hint", [
    (552_960, "v_proj is not square"),     # v_proj taken as 576 x 576
    (15_360, "one decoder layer"),         # one layer only
    (921_600, "rank 16"),                  # the QLoRA cell's rank
    (106_168_320, "not r x d_in x d_out"),  # multiplied instead of added
    (276_480, "only A"),                   # A without B
    (2_442_240, "all seven projections"),  # every projection
])
def test_lora_typical_slips_get_their_hint(answer, hint) -> None:
    feedback = Q.check_lora_count(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


def test_lora_other_wrong_answer() -> None:
    feedback = Q.check_lora_count(1234)
    assert not feedback.correct and "r x (d_in + d_out)" in feedback.hint


def test_checkers_have_one_line_docstrings() -> None:
    for fn in (Q.check_four_bit_size, Q.check_lora_count):
        assert fn.__doc__ and "\n" not in fn.__doc__.strip()


# --------------------------------------------------------------------------------------------
# The ticket report: counts with an interval, the verdict, right team against answered team
# --------------------------------------------------------------------------------------------
def test_embedding_text_reads_the_table_as_held() -> None:
    import torch

    model = torch.nn.Module()
    table = torch.nn.Embedding(1000, 64, dtype=torch.bfloat16)
    model.get_input_embeddings = lambda: table
    assert Q.embedding_text(model) == "128.0 KB of torch.bfloat16"
    table.float()
    assert Q.embedding_text(model) == "256.0 KB of torch.float32"


def test_count_line_shows_the_count_share_and_wilson_interval() -> None:
    line = Q.count_line("trained", 5, 8)
    assert line.startswith("trained ") and "right team  5/8 =  62 %" in line and "(95 % interval 31-86 %)" in line


@pytest.mark.parametrize("right, said", [(20, "better than guessing"), (19, "a weak result"), (5, "a weak result")])
def test_verdict_follows_the_check(right, said) -> None:
    text = Q.verdict(right, 12, 8, 48)  # the check: right >= 12 + 8
    assert said in text and f"{right - 12:+d} tickets" in text


def test_verdict_gives_a_guesser_its_chance() -> None:
    assert "a guesser gets 20 or more: 0.8 %" in Q.verdict(20, 12, 8, 48)
    assert "under 0.1 %" in Q.verdict(40, 12, 8, 48)


def test_confusion_table_puts_every_answer_in_one_cell() -> None:
    from course_utils.tickets import TEAMS, Ticket, answer_text

    tickets = [Ticket("t", team) for team in ("billing", "billing", "shipping", "account")]
    answers = [answer_text("billing"), "the shipping team", answer_text("shipping"), "no idea"]
    rows = Q.confusion_table(answers, tickets).splitlines()
    assert rows[0].split()[-5:] == [*TEAMS, "none"]
    cells = {row.split()[0]: [int(n) for n in row.split()[1:]] for row in rows[1:]}
    assert cells == {"billing": [1, 0, 0, 1, 0], "technical": [0] * 5, "account": [0, 0, 0, 0, 1],
                     "shipping": [0, 0, 0, 1, 0]}
    with pytest.raises(ValueError, match="one answer per ticket"):
        Q.confusion_table(answers[:2], tickets)


def test_the_notebook_check_can_fail() -> None:
    """01b's ticket check compares the trained count with both baselines plus a margin, not with a constant."""
    text = SOURCE.read_text(encoding="utf-8")
    assert "k = tickets.margin_over_chance(len(heldout))" in text
    assert "after.right >= max(before.right, always.right) + k" in text
