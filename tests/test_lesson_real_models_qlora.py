"""course_utils.lessons.real_models_qlora: notebook 01b's two exercises (right, other correct forms, unanswered,
each typical slip with its own hint) and its ticket report."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

from course_utils.architecture import PROJECTIONS, lora_adapter_params
from course_utils.lessons import real_models_qlora as Q
from course_utils.footprint import computed_sizes
from course_utils.models import QWEN3_CONFIG
from course_utils.quiet import quiet_libraries

with quiet_libraries():  # peft imports bitsandbytes where it is installed, whose import may log a notice
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

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
    task = text[text.index("### Your turn: a 4-bit size by hand") : text.index("check_four_bit_size(answer_gb)")]
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


@pytest.mark.parametrize(
    "answer, hint",
    [
        (2.01, "stay 16-bit"),  # every parameter at 4 bits
        (8.04, "16-bit size"),  # 2 bytes each
        (3.37, "tied"),  # the embedding counted twice
        (16.09, "half a byte"),  # 4 bytes per weight
        (2.42, "GiB"),  # 2.59 GB in GiB
        (2.82, "NF4 scales"),  # scales included
    ],
)
def test_size_typical_slips_get_their_hint(answer, hint) -> None:
    feedback = Q.check_four_bit_size(answer)
    assert not feedback.correct and feedback.answered and hint in feedback.hint


@pytest.mark.parametrize("answer", [5.0, "2.59", float("nan"), True])
def test_size_other_wrong_answers(answer) -> None:
    feedback = Q.check_four_bit_size(answer)
    assert not feedback.correct and feedback.answered and feedback.hint


# --------------------------------------------------------------------------------------------
# Exercise 2: QLoRA's two calls as one function, tried on SmolLM2-135M's shapes with two layers
# --------------------------------------------------------------------------------------------
projections = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # as the notebook's


# fmt: off
def qlora_adapter(model):
    """01b's worked solution, as its <details> block writes it (unformatted: the notebook's layout)."""
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)  # as on this CPU
    config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=projections,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)  # the peft model, not the model passed in
# fmt: on


def test_the_worked_solution_is_the_notebooks() -> None:
    """The function above is 01b's worked solution, line for line, and its projections are the notebook's."""
    lines = [line for line in inspect.getsource(qlora_adapter).splitlines() if '"""' not in line]
    text = SOURCE.read_text(encoding="utf-8")
    assert "\n".join(f"# {line}".rstrip() for line in lines) in text
    assert f"projections = {json.dumps(projections)}" in text
    assert tuple(projections) == PROJECTIONS


def test_adapter_worked_solution_passes_with_the_notebooks_numbers() -> None:
    feedback = Q.check_qlora_adapter(qlora_adapter)
    assert feedback.correct and feedback.answered, feedback
    layer = lora_adapter_params(Q.tryout_fields(), 16, PROJECTIONS) // Q.TRYOUT_LAYERS
    assert layer == 16 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536))  # one layer of SmolLM2's shapes
    assert f"{2 * layer:,} trainable numbers" in feedback.message
    assert "4,884,480 trainable numbers, 3.50 %" in feedback.message  # print_trainable_parameters in the notebook
    assert 30 * layer == 4_884_480


def test_adapter_check_leaves_the_random_state_and_needs_no_4bit() -> None:
    state = torch.random.get_rng_state()
    Q.check_qlora_adapter(qlora_adapter)
    assert torch.equal(state, torch.random.get_rng_state())
    model = Q._tryout_model()  # what the learner's function gets: plain bfloat16, no bitsandbytes involved
    assert not getattr(model, "is_loaded_in_4bit", False) and model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 576


def _adapter(prepare: bool = True, after: bool = False, **changes):
    """A learner's qlora_adapter: the recipe with ``changes`` to its LoraConfig (None drops a keyword)."""
    settings = dict(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=projections, task_type="CAUSAL_LM")
    settings.update(changes)

    def fn(model):
        if prepare and not after:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        peft_model = get_peft_model(model, LoraConfig(**{k: v for k, v in settings.items() if v is not None}))
        return prepare_model_for_kbit_training(peft_model) if after else peft_model

    return fn


def _defaults(model):
    model = prepare_model_for_kbit_training(model)
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=16, target_modules=projections, task_type="CAUSAL_LM"))


#: Other correct ways to write it: each must pass.
ADAPTER_RIGHT_FORMS = {
    "targets as a set": _adapter(target_modules=set(projections)),
    "targets as a tuple": _adapter(target_modules=tuple(projections)),
    "all-linear": _adapter(target_modules="all-linear"),
    "a regex": _adapter(target_modules=r".*_proj"),
    "no dropout keyword": _adapter(lora_dropout=None),
    "dropout": _adapter(lora_dropout=0.05),
    "prepare's defaults": _defaults,
}


@pytest.mark.parametrize("form", ADAPTER_RIGHT_FORMS)
def test_adapter_other_correct_forms_pass(form: str) -> None:
    feedback = Q.check_qlora_adapter(ADAPTER_RIGHT_FORMS[form])
    assert feedback.correct, feedback


#: Each typical slip, and a phrase of its own hint (no two slips share a hint).
ADAPTER_SLIPS = {
    "rank 8": (_adapter(r=8), "rank is r=16"),
    "only q_proj and v_proj": (_adapter(target_modules=["q_proj", "v_proj"]), "all seven projections"),
    "no preparation": (_adapter(prepare=False), "upcasts its 16-bit parts"),
    "preparation after get_peft_model": (_adapter(after=True), "call it first"),
    "adapter on the embedding": (_adapter(target_modules=[*projections, "embed_tokens"]), "or lm_head"),
    "adapter on the head": (_adapter(target_modules=[*projections, "lm_head"]), "or lm_head"),
    "modules_to_save": (_adapter(modules_to_save=["lm_head"]), "Leave modules_to_save out"),
    "no task_type": (_adapter(task_type=None), "peft then wraps a causal language model"),
    "lora_alpha left at 8": (_adapter(lora_alpha=None), "peft's default is 8"),
    "some layers only": (_adapter(layers_to_transform=[0]), "every decoder layer"),
    "DoRA": (_adapter(use_dora=True), "no use_dora"),
    "the model passed in": (lambda model: _adapter()(model).get_base_model(), "returns a new wrapper"),
    "no adapter": (lambda model: prepare_model_for_kbit_training(model), "Wrap it"),
    "the config": (lambda model: LoraConfig(r=16), "Return what get_peft_model"),
}


@pytest.mark.parametrize("slip", ADAPTER_SLIPS)
def test_adapter_each_named_slip_gets_its_own_hint(slip: str) -> None:
    fn, phrase = ADAPTER_SLIPS[slip]
    feedback = Q.check_qlora_adapter(fn)
    assert not feedback.correct and feedback.answered and phrase in feedback.hint, feedback
    others = {p for _, p in ADAPTER_SLIPS.values() if p != phrase}  # the embedding and the head share a hint
    assert not any(other in feedback.hint for other in others), feedback


def test_every_hint_in_the_table_is_one_slips() -> None:
    """Each slip's phrase is in exactly one hint of the table and each hint has one phrase: with the test above,
    every hint is reached by its slip, and no hint is dead."""
    phrases = {phrase for _, phrase in ADAPTER_SLIPS.values()}
    hints = list(Q.ADAPTER_HINTS.values())
    assert all(sum(phrase in hint for hint in hints) == 1 for phrase in phrases)
    assert all(sum(phrase in hint for phrase in phrases) == 1 for hint in hints)


def test_adapter_not_written_yet() -> None:
    def stub(model):
        raise NotImplementedError  # your code: prepare_model_for_kbit_training, then LoraConfig and get_peft_model

    def no_return(model):
        prepare_model_for_kbit_training(model)

    for fn in (..., None, stub, no_return):
        feedback = Q.check_qlora_adapter(fn)
        assert not feedback.correct and not feedback.answered, fn
    assert "replace the `raise NotImplementedError` line in qlora_adapter" in str(Q.check_qlora_adapter(stub))


def test_adapter_errors_are_one_line() -> None:
    feedback = Q.check_qlora_adapter(lambda model: 1 / 0)
    assert not feedback.correct and "ZeroDivisionError" in feedback.message and "\n" not in feedback.message
    assert "should be a function" in Q.check_qlora_adapter(42).message


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
    assert cells == {
        "billing": [1, 0, 0, 1, 0],
        "technical": [0] * 5,
        "account": [0, 0, 0, 0, 1],
        "shipping": [0, 0, 0, 1, 0],
    }
    with pytest.raises(ValueError, match="one answer per ticket"):
        Q.confusion_table(answers[:2], tickets)


def test_the_notebooks_ticket_check_can_fail() -> None:
    """01b's ticket check, run as the notebook writes it: the trained count must beat the better baseline by k."""
    import ast
    from types import SimpleNamespace

    from course_utils import tickets

    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    k_line = next(n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "k")
    k = eval(compile(ast.Expression(k_line.value), "01b", "eval"), {"tickets": tickets, "heldout": [None] * 48})
    assert k == 8 and tickets.chance_tail(48, 12 + k) <= 0.01  # a guesser (12 of 48 on average) passes under 1 %
    printed = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Expr) and "beats both baselines" in ast.unparse(n) and isinstance(n.value, ast.Call)
    )
    check = compile(ast.Expression(printed.args[-1]), "01b", "eval")

    def passes(after: int, before: int, always: int) -> bool:
        counts = {"after": after, "before": before, "always": always}
        return eval(check, {name: SimpleNamespace(right=n) for name, n in counts.items()} | {"k": k})

    assert passes(20, 12, 12) and not passes(19, 12, 12)  # k more than the baselines, and not one less
    assert not passes(20, 13, 12) and not passes(20, 12, 13)  # the better of the two baselines counts
