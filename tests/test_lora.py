"""course_utils.lora: LoRA counted by peft on the meta device (and by hand), set up on a tiny stand-in, bad input."""

from __future__ import annotations

import pytest
import torch

from course_utils import lora
from course_utils import models as M
from course_utils.architecture import PROJECTIONS, Architecture
from course_utils.quiet import import_bitsandbytes
from course_utils.models import QWEN3_CONFIG, meta_model
from course_utils.standin import STANDIN_CONFIG
from course_utils.tickets import load_tickets, training_example
from tiny_models import tiny_config


def _lora_params_by_hand(model: torch.nn.Module, r: int = 16, targets=PROJECTIONS) -> int:
    """The reference count: r x (d_in + d_out) per targeted linear (A is r x d_in, B d_out x r)."""
    total = 0
    for name, module in model.named_modules():
        layer = getattr(module, "base_layer", module)  # a layer peft already wrapped: count its base
        if isinstance(layer, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            total += r * (layer.in_features + layer.out_features)
    assert total > 0, f"none of {targets} names a linear layer"
    return total


def _adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a peft model by name (``...lora_A.default.weight``, ``...lora_B...``)."""
    return {name: p for name, p in model.named_parameters() if ".lora_A." in name or ".lora_B." in name}


# --------------------------------------------------------------------------------------------
# LoRA counts
# --------------------------------------------------------------------------------------------
def test_lora_counts_on_the_meta_device() -> None:
    smol = lora.lora_count(STANDIN_CONFIG)
    assert smol.trainable == 4_884_480 and smol.base == 134_515_008 and smol.name == "smollm2-135m"
    assert "trainable%: 3.50 " in smol.summary()  # peft's trainable%: adapter / (base + adapter)
    qwen3 = lora.lora_count(QWEN3_CONFIG)
    assert (qwen3.trainable, qwen3.base) == (33_030_144, 4_022_468_096)
    assert qwen3.summary().endswith("trainable%: 0.81  (of the base alone, 4,022,468,096: 0.82 %)")
    # the LoRA lesson's figure: rank 8 on q_proj and v_proj of SmolLM2 trains 460,800
    assert lora.lora_count(STANDIN_CONFIG, r=8, alpha=16, targets=["q_proj", "v_proj"]).trainable == 460_800


def test_lora_by_hand_matches_peft() -> None:
    """peft's counts (lora_count) against the layers counted by hand and against the arithmetic of Architecture."""
    smol = meta_model(STANDIN_CONFIG)
    assert (
        _lora_params_by_hand(smol, 16)
        == 4_884_480
        == Architecture.from_config(STANDIN_CONFIG).adapter_params(16, PROJECTIONS)
    )
    assert _lora_params_by_hand(smol, 8, ["q_proj", "v_proj"]) == 460_800
    assert _lora_params_by_hand(meta_model(QWEN3_CONFIG), 16) == 33_030_144 == lora.lora_count(QWEN3_CONFIG).trainable


def test_the_default_targets_are_the_seven_projections() -> None:
    assert set(lora._lora_config(16, 16, PROJECTIONS).target_modules) == set(PROJECTIONS) and len(PROJECTIONS) == 7
    assert lora.lora_count(STANDIN_CONFIG).trainable == lora.lora_count(STANDIN_CONFIG, targets=PROJECTIONS).trainable


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        ({"r": 0}, ValueError, "r "),
        ({"r": 2.5}, TypeError, "r must"),
        ({"alpha": 0}, ValueError, "alpha"),
        ({"alpha": "16"}, TypeError, "alpha"),
        ({"targets": 7}, TypeError, "targets"),
        ({"targets": []}, ValueError, "targets"),
        ({"targets": ["no_such_layer"]}, ValueError, "no_such_layer"),
    ],
)
def test_lora_bad_input(kwargs, error, word) -> None:
    with pytest.raises(error, match=word):
        lora.lora_count(tiny_config(), name="tiny", **kwargs)


# --------------------------------------------------------------------------------------------
# The same code path end to end, on a tiny stand-in
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_qlora_steps_lower_the_loss(tiny_standin) -> None:
    tok = M.load_tokenizer(tiny_standin)
    model = lora.add_lora(M.load_model(tiny_standin, 4, device="cpu"))
    trainable, total = lora.trainable_counts(model)
    assert trainable == _lora_params_by_hand(model, 16) and total > trainable
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    batches = [training_example(tok, ticket) for ticket in load_tickets()[:2]]  # what notebook 01b trains on
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = _mean_loss(model, batches)
    torch.manual_seed(0)
    losses = []
    model.train()
    for step in range(6):
        loss = model(**batches[step % 2]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and _mean_loss(model, batches) < before
    text = M.generate_text(model, tok, "The capital of France is", max_new_tokens=3)
    assert text.startswith("The capital of France is")


def _mean_loss(model, batches) -> float:
    """Average loss over ``batches``, in eval mode and without gradients."""
    model.eval()
    with torch.no_grad():
        return sum(float(model(**batch).loss) for batch in batches) / len(batches)


def test_lora_start_is_reproducible(tiny_standin) -> None:
    def first_a():
        model = lora.add_lora(M.load_model(tiny_standin, 16, device="cpu"))
        return next(p for n, p in model.named_parameters() if "lora_A" in n).detach().clone()

    first = first_a()
    torch.manual_seed(123)  # another global random state: the same start
    state = torch.get_rng_state()
    assert torch.equal(first, first_a()) and bool(first.abs().sum() > 0)  # A starts random, not at zero
    assert torch.equal(torch.get_rng_state(), state)  # the global random state is left alone


def test_without_bitsandbytes_lora_runs_on_the_16_bit_model(monkeypatch, tiny_standin) -> None:
    """The notebook's fallback: LoRA on the 16-bit model, the same adapter count as QLoRA."""
    monkeypatch.setattr(M, "import_bitsandbytes", lambda: None)  # a machine where bitsandbytes is missing
    model = lora.add_lora(M.load_model(tiny_standin, 16, device="cpu"))
    trainable, total = lora.trainable_counts(model)
    assert trainable == _lora_params_by_hand(model, 16) and total > trainable
    tok = M.load_tokenizer(tiny_standin)
    model.train()
    loss = model(**training_example(tok, load_tickets()[0])).loss
    loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------
# The helper and the direct peft calls do the same
# --------------------------------------------------------------------------------------------
@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
def test_add_lora_equals_the_three_direct_peft_calls(tiny_standin) -> None:
    """The notebook's comparison: LoraConfig + prepare_model_for_kbit_training + get_peft_model, seeded."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    from course_utils.quiet import quiet_libraries

    config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=list(PROJECTIONS), task_type="CAUSAL_LM")
    state = torch.get_rng_state()
    torch.manual_seed(0)
    with quiet_libraries():  # as in the notebook: no deprecation notices
        direct = get_peft_model(
            prepare_model_for_kbit_training(
                M.load_model(tiny_standin, 4, device="cpu"), use_gradient_checkpointing=False
            ),
            config,
        )
    torch.set_rng_state(state)
    helper = lora.add_lora(M.load_model(tiny_standin, 4, device="cpu"), r=16, alpha=16, targets=PROJECTIONS)
    assert lora.trainable_counts(direct) == lora.trainable_counts(helper)
    assert len(_adapter_tensors(helper)) == 2 * 2 * 7  # A and B, 7 projections, 2 layers
    mine, theirs = _adapter_tensors(helper), _adapter_tensors(direct)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine)  # same random start


def test_summary_says_which_percentage_is_which() -> None:
    count = lora.LoraCount("m", trainable=10, base=990)
    assert count.summary() == (
        "m: trainable params: 10 || all params: 1,000 || trainable%: 1.00  (of the base alone, 990: 1.01 %)"
    )


@pytest.mark.skipif(import_bitsandbytes() is None, reason="bitsandbytes is not installed")
@pytest.mark.parametrize(
    "kwargs, rest, checkpointing",
    [
        ({}, torch.float32, False),  # the lesson's call on a CPU: prepared, no checkpointing
        ({"checkpointing": True}, torch.float32, True),
        ({"kbit_preparation": False, "checkpointing": True}, torch.bfloat16, True),
    ],
)
def test_add_lora_prepares_a_4bit_model_unless_told_not_to(tiny_standin, kwargs, rest, checkpointing) -> None:
    model = lora.add_lora(M.load_model(tiny_standin, 4, device="cpu"), r=4, alpha=8, **kwargs)
    named = dict(model.named_parameters())
    assert {p.dtype for n, p in named.items() if "norm" in n or "embed_tokens" in n} == {rest}
    assert all(p.requires_grad == ("lora_" in n) for n, p in named.items())
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules()) is checkpointing
    assert model.config.use_cache is not checkpointing
