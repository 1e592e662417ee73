# %% [markdown]
# # Real models in 4 bits, and QLoRA
#
# Notebook 01 quantized one weight matrix by hand. Here you quantize a whole language model, see where its
# memory goes, and fine-tune it the QLoRA way: a frozen 4-bit model with a small trainable adapter on top.
#
# **What you will be able to do**
# - load a causal language model in 16 bits and in 4-bit NF4 with one `BitsAndBytesConfig`, and read its footprint;
# - explain, part by part, why a 4-bit model is about a third of its 16-bit size, not a quarter;
# - compute the size of a model you cannot download, from its architecture alone (the *meta* device);
# - set up QLoRA with `peft`, count what it trains, and run a few real training steps.
#
# **Time:** about 25 minutes. The code runs on a laptop CPU or a free Colab GPU; the last cell prints how much CPU
# time it took.
#
# **Before you start:** notebook 01 (scale, blocks of 64, NF4).

# %% [setup] extras=["peft"]

# %% [markdown]
# ## Why: one matrix is not a model
#
# The lesson loads `Qwen/Qwen2.5-1.5B-Instruct` twice, in 16 bits and in 4-bit NF4, and compares
# `get_memory_footprint()`. Two things happen there that one matrix cannot show you:
#
# 1. **Not every layer is quantized.** The 4-bit model is about a *third* of the 16-bit one, not a quarter.
# 2. **You cannot train 4-bit weights**, yet you can fine-tune a 4-bit model: QLoRA freezes it and trains a
#    small 16-bit adapter beside it.
#
# ### The real model, or a stand-in?
#
# The real model needs a GPU and a download from the Hugging Face Hub. Without either, this notebook uses a
# **stand-in**: the real architecture of SmolLM2-135M, rebuilt from its config file (shipped in `data/configs`)
# with *random* weights, saved once to a cache folder and then loaded through **the same** `from_pretrained`,
# the same quantization config and the same `peft` calls. Its sizes and parameter counts are real; the text it
# writes is noise, and every line it prints says so.
#
# The decision takes at most about a second: no GPU, or `HF_HUB_OFFLINE` set, decides at once; otherwise one
# quick connection attempt to the Hub. (Left to itself, the Hub client retries for about 46 s before giving up.)

# %%
import time

import torch

from course_utils import footprint, lora, models, standin
from course_utils.units import format_bytes

cpu_start = time.process_time()
choice = standin.choose_model()  # the real Qwen2.5-1.5B-Instruct, or the stand-in (built once, on first use)
print(choice.label)
print("why:", choice.reason)

# %% [markdown]
# ## How it works: which parts get 4 bits?
#
# `load_in_4bit=True` replaces every `nn.Linear` layer of the model by a bitsandbytes `Linear4bit`, except the
# output head. Everything else keeps its 16-bit dtype: the **embedding table**, the **norms**, any **biases**.
# To see what that means, build the stand-in's architecture on PyTorch's *meta* device: tensors with shapes but
# no data, so even a 4-billion-parameter model costs no memory.

# %%
arch = models.meta_model(standin.STANDIN_CONFIG)  # shapes only: no weights, no memory
print(f"SmolLM2-135M architecture: {footprint.count_model_parameters(arch):,} parameters")
print("lm_head shares the embedding table (tied):", footprint.is_tied(arch))
print(arch.model.layers[0])  # one of the 30 decoder layers

# %% [markdown]
# Seven `Linear` layers per decoder layer (q, k, v, o in attention; gate, up, down in the MLP) will go to
# 4 bits. The embedding table (49,152 tokens × 576 numbers) and the two `RMSNorm`s will not.
#
# **Predict before you run.** A 4-bit weight takes a quarter of the bytes of a 16-bit one. What fraction of its
# 16-bit size will this whole model take in 4 bits: 25 %, a bit more, or a lot more? Write your guess down.

# %%
print(footprint.breakdown_table(arch, low_bits=4))

# %% [markdown]
# 41 %, not 25 %. The embedding table is 21 % of this small model's parameters, and it stays 16-bit: it alone
# is 56.6 MB of the 109.8 MB. The lm_head costs nothing extra because it is *tied*: it reuses the embedding
# table's matrix. (A model with an untied head would keep a second vocabulary-sized matrix in 16 bits.)
#
# Bigger models are closer to a quarter, because their linear layers grow with width × width while the embedding
# grows only with vocabulary × width.

# %% [markdown]
# ## Interactive demo: how close to a quarter?
#
# Move the sliders: a Llama-shaped model (the MLP 8/3 times wider than the model, k and v a third of q) with your
# width, depth and vocabulary. Watch the 4-bit share fall towards 25 % as the model gets wider and deeper, and
# rise when the vocabulary grows or the head is untied. (The instructor's live demo; the printed cell below
# gives three fixed points.)

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: a live widget; it needs a Jupyter front end to display.
from course_utils.widgets.models import four_bit_ratio_panel

four_bit_ratio_panel()

# %%
for width, layers, vocab, tied, mlp in ((576, 30, 49_152, True, 8 / 3),        # SmolLM2-135M
                                        (4096, 32, 128_256, False, 3.5),      # Llama-3-8B-like
                                        (8192, 80, 128_256, False, 3.5)):     # Llama-3-70B-like
    print(footprint.four_bit_ratio_report(width, layers, vocab, tied, mlp_ratio=mlp), end="\n\n")

# %% [markdown]
# ## Benefits and trade-offs
#
# **Benefits**
# - Weights in linear layers take 0.5 byte instead of 2: the 135M stand-in drops from 269.0 MB to 109.8 MB, the
#   real Qwen2.5-1.5B-Instruct from 3.09 GB to 1.12 GB (both below).
# - QLoRA fine-tunes a model whose 16-bit weights would not fit: the base stays frozen in 4 bits and only a small
#   adapter gets gradients and optimizer states.
#
# **Trade-offs**
# - Not a quarter: embeddings, norms and biases stay 16-bit, and NF4 stores one float32 scale per 64 weights on
#   the side (0.5 bit per weight, which `get_memory_footprint()` does not count).
# - Some quality loss, larger for small models. Measure your task again after quantizing.
# - Not always faster: every 4-bit weight is unpacked to 16 bits before the maths.
# - Small models carry relatively bigger adapters (below): QLoRA's "under 1 %" is a big-model figure.

# %% [markdown]
# ## In practice: one loading call, in 16 and 4 bits
#
# One call loads either width. The 16-bit dtype comes from the device: bfloat16 on a CPU and on GPUs of compute
# capability 8.0 or more (A100, L4, H100), float16 on a T4, which has no bfloat16 tensor cores.

# %%
started = time.perf_counter()
model_16 = models.load_model(choice, bits=16)
load_16_s = time.perf_counter() - started
tokenizer = models.load_tokenizer(choice)
fp16 = model_16.get_memory_footprint()
print(f"{choice.label} 16-bit: {format_bytes(fp16)}, weights in {model_16.dtype}")

# %% [markdown]
# `bits=4` passes the lesson's `BitsAndBytesConfig` (NF4, unpacked to that same 16-bit dtype for the maths) and
# quantizes each linear layer as it is loaded. 4 bits need the bitsandbytes package, which does not install on
# every machine: without it, each 4-bit cell prints one line saying what it skipped, and the 4-bit size is
# computed from the parts instead of measured.

# %%
no_4bit = models.bitsandbytes_missing()  # None when bitsandbytes works here, else the reason 4-bit steps are skipped
if no_4bit:
    model_4, fp4 = None, footprint.footprint_bytes(model_16, 4)
    print(f"4-bit load skipped: {no_4bit}.")
    print(f"{choice.label}  4-bit: {format_bytes(fp4)}  COMPUTED from the parts ({100 * fp4 / fp16:.0f} % of 16-bit)")
else:
    config_4 = models.quantization_config(4)  # the lesson's BitsAndBytesConfig
    print(f"4-bit format: {config_4.bnb_4bit_quant_type}, unpacked to {config_4.bnb_4bit_compute_dtype} for the maths")
    started = time.perf_counter()
    model_4 = models.load_model(choice, bits=4)
    load_4_s = time.perf_counter() - started
    fp4 = model_4.get_memory_footprint()
    print(f"{choice.label}  4-bit: {format_bytes(fp4)}  ({100 * fp4 / fp16:.0f} % of 16-bit)")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: load times depend on the machine and its load.
print(f"load times here: 16-bit {load_16_s:.1f} s" + ("" if model_4 is None else
      f", 4-bit {load_4_s:.1f} s (the 4-bit load quantizes every linear layer)"))

# %% [markdown]
# Look inside: a 4-bit linear layer stores two weights per byte, as `uint8`, and the measured footprint is
# exactly what the part-by-part arithmetic predicted from the 16-bit model.

# %%
if model_4 is None:
    print(f"Look inside a 4-bit layer skipped: {no_4bit}.")
else:
    q_proj = model_4.model.layers[0].self_attn.q_proj
    print(choice.label)
    print(q_proj, "| stored as", q_proj.weight.dtype, tuple(q_proj.weight.shape))
    print("embedding table stays", model_4.get_input_embeddings().weight.dtype)
    print("measured = predicted from the parts:",
          fp16 == footprint.footprint_bytes(model_16, 16), fp4 == footprint.footprint_bytes(model_16, 4))
    scales = footprint.measured_scale_bytes(model_4)
    print(f"NF4 scales stored beside the weights (not in get_memory_footprint): {format_bytes(scales)}; "
          f"with them, 4-bit is {100 * (fp4 + scales) / fp16:.0f} % of 16-bit")

# %% [markdown]
# ### The real Qwen2.5-1.5B-Instruct, computed
#
# Its config file ships with the course, so its sizes can be computed on the meta device: no download, no GPU.
# These are **computed**, not loaded; on a GPU the cell above measures the same numbers.

# %%
qwen = models.meta_model(models.QWEN25_CONFIG)
print(footprint.computed_sizes(models.QWEN25_CONFIG, "Qwen/Qwen2.5-1.5B-Instruct").summary())
print()
print(footprint.breakdown_table(qwen, low_bits=4))

# %% [markdown]
# 36 %: "about a third", as promised. Its embedding table (151,936 tokens × 1,536) is 15 % of the model
# and stays 16-bit; Qwen2's q, k, v biases stay 16-bit too, but they are tiny.

# %%
from course_utils.plots import models as P

loaded = "real, loaded" if not choice.is_standin else "stand-in, loaded"
name = "Qwen2.5-1.5B" if not choice.is_standin else "SmolLM2-135M"
if model_4 is not None:
    parts_4, how_4 = footprint.footprint_parts(model_4, 4), loaded
else:
    parts_4, how_4 = footprint.footprint_parts(model_16, 4), "computed"
fig = P.footprint_chart([
    (f"{name} 16-bit ({loaded})", footprint.footprint_parts(model_16, 16), fp16),
    (f"{name} 4-bit ({how_4})", parts_4, fp16),
    ("Qwen2.5-1.5B 16-bit (computed)", footprint.footprint_parts(qwen, 16), footprint.footprint_bytes(qwen, 16)),
    ("Qwen2.5-1.5B 4-bit (computed)", footprint.footprint_parts(qwen, 4), footprint.footprint_bytes(qwen, 16)),
])

# %% [markdown]
# **Text description of the chart.** Four horizontal stacked bars, each drawn as a percentage of the same
# model's 16-bit footprint, with a dashed line at 25 %. Red is the embedding table (16-bit), blue the linear
# layers, grey the norms, biases and buffers (under 0.1 %, too thin to see). SmolLM2-135M (the stand-in,
# loaded): 16-bit 269.0 MB (100 %), 4-bit 109.8 MB (41 %), of which the red embedding table is 56.6 MB,
# 21 percentage points. Qwen2.5-1.5B (computed): 16-bit 3.09 GB (100 %), 4-bit 1.12 GB (36 %), of which the
# embedding table is 0.47 GB, 15 points. In both 4-bit bars the blue linear layers shrink to a quarter of their
# 16-bit width; the red part does not shrink, so neither 4-bit bar gets down to the 25 % line. (On a GPU the top
# two bars are the real model, loaded, and match the computed ones.)

# %% [markdown]
# ### Ask it a question
#
# The lesson asks the 4-bit model to complete "The capital of France is". A real model answers Paris; the
# stand-in's random weights produce noise (its small offline tokenizer spells 512 tokens, so the other ids of
# its 49,152-row vocabulary are masked to keep the noise printable).
#
# **A CPU pitfall first.** On CPUs with AVX-512-bf16, bitsandbytes repacks 4-bit weights into a faster inference
# layout the first time they run without gradients, and such weights can no longer be trained: the QLoRA steps
# below would fail. We switch the repacking off before generating (it only costs CPU generation speed; on a GPU
# it changes nothing). The other fix is to train first and generate afterwards.

# %%
if model_4 is None:
    print(f"4-bit repacking switch skipped (there are no 4-bit layers): {no_4bit}.")
else:
    print(choice.label, "4-bit layers kept trainable:", models.keep_4bit_trainable_on_cpu(model_4))

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: the stand-in's noise depends on the CPU's rounding; the real model's answer on a GPU.
asked, width = (model_4, "4-bit") if model_4 is not None else (model_16, "16-bit (no 4-bit model here)")
started = time.perf_counter()
answer = models.generate_text(asked, tokenizer, "The capital of France is", max_new_tokens=10)
what = "NOISE from random weights, not an answer:" if choice.is_standin else "answer:"
print(f"{choice.label} {width} {what} {answer!r}  ({time.perf_counter() - started:.1f} s)")

# %% [markdown]
# ## QLoRA: a frozen 4-bit base and a small 16-bit adapter
#
# LoRA leaves a weight matrix W (d_out × d_in) frozen and learns a low-rank change beside it: B·A, with A of
# size r × d_in and B of size d_out × r. Only A and B are trained. With QLoRA, W is the 4-bit weight; A and B
# are ordinary 16- or 32-bit tensors. From scratch, for one of the stand-in's attention matrices:

# %%
d_in, d_out, r = 576, 576, 16  # the stand-in's q_proj, the lesson's rank
print(f"q_proj: {d_in * d_out:,} frozen weights; adapter A ({r}x{d_in}) + B ({d_out}x{r}) = "
      f"{r * (d_in + d_out):,} trainable numbers ({100 * r * (d_in + d_out) / (d_in * d_out):.1f} % of the matrix)")

# %% [markdown]
# Now the library: `peft` wraps the seven projection matrices with rank 16, alpha 16, and freezes
# everything else. (`add_lora` also runs `prepare_model_for_kbit_training`, the standard QLoRA step, which on a
# GPU turns on gradient checkpointing; and it seeds the adapters' random start, so reruns train the same way.)
# Without bitsandbytes the same adapter goes on the 16-bit model instead: plain LoRA, and the cell says so.

# %%
from course_utils.architecture import PROJECTIONS  # q, k, v, o, gate, up, down

if model_4 is None:
    print(f"QLoRA skipped: {no_4bit}. Plain LoRA on the 16-bit model instead: the same adapter, a 16-bit base.")
qlora = lora.add_lora(model_4 if model_4 is not None else model_16, r=16, alpha=16, targets=PROJECTIONS)
print(choice.label)
qlora.print_trainable_parameters()
print(f"by hand, r x (d_in + d_out) summed over the targeted layers: {lora.lora_params_by_hand(qlora, 16):,}")

# %% [markdown]
# ### "Under 1 %"? That depends on the model
#
# The lesson's Unsloth example promises under 1 % trainable parameters. That holds for its model, Qwen3-4B; the same
# adapter on the 135M stand-in trains 3.5 %. Counted on the meta device from the real configs (peft's
# `trainable%` divides by base + adapter; the brackets divide by the base alone):

# %%
for config, label in ((standin.STANDIN_CONFIG, "SmolLM2-135M"), (models.QWEN25_CONFIG, "Qwen2.5-1.5B-Instruct"),
                      (models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507")):
    print(lora.lora_count(config, r=16, alpha=16, targets=PROJECTIONS, name=label).summary())

# %% [markdown]
# Why do small models carry relatively bigger adapters? For a d × d matrix, the adapter holds r·(d + d) = 2rd
# numbers against d² weights: a share of **2r / d**. It falls as the model gets wider. With r = 16, the stand-in's
# width 576 gives 2·16/576 = 5.6 % per square matrix; Qwen3-4B's width 2,560 gives 1.25 %. (Over the whole model
# the share is lower, because the embedding table gets no adapter.)

# %%
for label, width in (("SmolLM2-135M", 576), ("Qwen2.5-1.5B", 1536), ("Qwen3-4B", 2560)):
    print(f"{label:13} width {width:5}: a square matrix's adapter is 2r/d = {100 * 2 * 16 / width:.2f} % of it")

# %% [markdown]
# ### A few real training steps
#
# The training data is 40 short lines shipped with the course (`data/standin/train.jsonl`). The loop is plain
# PyTorch: the optimizer sees only the adapter's parameters, and the gradients never touch the 4-bit weights.
# The learning rate, 2e-3, is on the high side (QLoRA recipes often use 1e-4 to 2e-4 over thousands of steps); it
# makes eight steps of a demo visible. On a T4 the base computes in float16, whose small gradients can round to
# zero, so the loss is scaled up for the backward pass (`GradScaler`, switched on by one flag; notebook 02 explains
# it). In bfloat16, on a CPU or a newer GPU, the flag is off and the scaler does nothing.
#
# The exact losses differ in their last digits from one CPU or GPU to another (16-bit sums are added up in a
# different order), so the compared check below asks for a drop of more than 10 %: far above those differences,
# far below the drop itself, for the stand-in and for a real model alike. The raw numbers are printed in the cell after it.

# %%
device = next(qlora.parameters()).device
batches = models.training_batches(tokenizer, models.training_texts(), batch_size=8, max_length=24, device=device)
before = models.mean_loss(qlora, batches)  # over all 40 lines, no gradients
print(f"{choice.label} {len(batches)} batches of up to 8 lines")

# %%
from course_utils.hardware import autocast_dtype, needs_loss_scaling

optimizer = torch.optim.AdamW([p for p in qlora.parameters() if p.requires_grad], lr=2e-3)
scaler = torch.amp.GradScaler(device.type, enabled=needs_loss_scaling(autocast_dtype(device)))  # on for float16
losses, started = [], time.perf_counter()
qlora.train()
for step in range(8):
    loss = qlora(**batches[step % len(batches)]).loss
    scaler.scale(loss).backward()  # gradients reach the adapters only: the base is frozen
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    losses.append(loss.item())
train_s = time.perf_counter() - started
print(f"{choice.label} 8 steps done, loss scaling {'on' if scaler.is_enabled() else 'off'}")

# %%
after = models.mean_loss(qlora, batches)
print("mean loss over the 40 lines fell by more than 10 %:", after < 0.9 * before)

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: losses and times differ in the last digits from one CPU (or GPU) to another.
print(f"{choice.label} mean loss before {before:.2f}, after {after:.2f}")
print("loss per step:", " ".join(f"{x:.2f}" for x in losses))
print(f"8 training steps took {train_s:.1f} s here ({train_s / 8:.2f} s per step)")
print("after training:", repr(models.generate_text(qlora, tokenizer, "The capital of France is", max_new_tokens=10)))

# %% [markdown]
# The stand-in starts a little above the loss of a uniform guess over its vocabulary (ln 49,152 ≈ 10.8; random
# logits are not perfectly flat), and its adapter quickly learns which few tokens the training text uses; what it "says" afterwards is typically one frequent
# word or fragment repeated. It still knows nothing about France: eight steps on 40 lines teach a format, not
# facts, and the base is random. On the real model the loss starts much lower (it already knows English).

# %% [markdown]
# ### The Unsloth version
#
# Unsloth wraps the same two steps (a 4-bit base, then LoRA on the seven projections) with faster GPU kernels.
# It needs a CUDA GPU and downloads `unsloth/Qwen3-4B-Instruct-2507`. It also patches torch, transformers and
# peft when it is imported, so it must be installed in a *fresh* runtime, before anything else runs; installing
# it into this kernel, which has already imported them, would break things. So the cell runs only where Unsloth
# is already installed; elsewhere it prints what to do in a fresh runtime, and what the peft cells above showed.

# %%
from course_utils.unsloth import unsloth_plan

plan = unsloth_plan(choice)
print(plan.message())
if plan.run:
    from unsloth import FastLanguageModel

    model_u, tokenizer_u = FastLanguageModel.from_pretrained(
        model_name="unsloth/Qwen3-4B-Instruct-2507", max_seq_length=2048, load_in_4bit=True)  # frozen 4-bit base
    model_u = FastLanguageModel.get_peft_model(model_u, r=16, lora_alpha=16, target_modules=list(PROJECTIONS))
    model_u.print_trainable_parameters()  # the meta-device count above: 33,030,144 trainable

# %% [markdown]
# ### On a GPU (what this notebook does there)
#
# With a CUDA GPU and the Hub reachable (a Colab T4 is enough), `choose_model` picks the real
# `Qwen/Qwen2.5-1.5B-Instruct` and every cell above runs on it: 16-bit (bfloat16 on Ampere or newer, float16 on a
# T4) and 4-bit loads with `device_map="auto"`, footprints of about 3.1 GB and 1.1 GB matching the computed
# ones, a real answer to "The capital of France is", QLoRA with 18,464,768 trainable parameters (1.18 %) and
# gradient checkpointing, the same eight training steps (with loss scaling on a T4), and the Unsloth cell on
# Qwen3-4B if Unsloth was installed in a fresh runtime. The outputs saved in this notebook are the stand-in's,
# from a CPU run without a GPU or the Hub.
#
# Note: older course material says bitsandbytes needs a GPU. The version pinned here (0.50) also runs NF4 on a
# CPU, which is how the steps above ran; the timing cell after the training steps prints the seconds per step:
# on 8 short lines of a 135M model, that is a demo, not a way to fine-tune.

# %% [markdown]
# ## Run it yourself
#
# The Unsloth example's model is Qwen3-4B-Instruct-2507 (`models.QWEN3_CONFIG`). Before running anything, predict:
# will its 4-bit share be closer to 25 % than Qwen2.5-1.5B's 36 %? Then compute its 16-bit and 4-bit sizes and
# its breakdown, and count a smaller adapter: rank 8 on `q_proj` and `v_proj` only.

# %%
# Your code here. Useful: footprint.computed_sizes, footprint.breakdown_table, models.meta_model,
# lora.lora_count(..., r=8, targets=[...])

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# ```python
# print(footprint.computed_sizes(models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507").summary())
# print(footprint.breakdown_table(models.meta_model(models.QWEN3_CONFIG), low_bits=4))
# print(lora.lora_count(models.QWEN3_CONFIG, r=8, alpha=16, targets=["q_proj", "v_proj"]).summary())
# ```
#
# Qwen3-4B-Instruct-2507 has 4,022,468,096 parameters: 8.04 GB in 16 bits, 2.59 GB in 4 bits, **32 %**. Yes,
# closer to a quarter than Qwen2.5-1.5B (36 %): its embedding table (151,936 × 2,560) is the same vocabulary
# but only 9.7 % of a model that is 2.6 times bigger. Its NF4 scales add another 0.23 GB.
# Rank 8 on q_proj and v_proj trains 2,949,120 numbers, 0.07 % of the base (the Unsloth example's full adapter: 33,030,144,
# 0.82 %). On the stand-in the same small adapter trains 460,800 (0.34 %), the figure of the LoRA lesson.
# </details>

# %% [markdown]
# ## Knowledge check
#
# 1. A 4-bit weight is a quarter of a 16-bit one. Why is the 4-bit Qwen2.5-1.5B-Instruct 36 % of its 16-bit size?
#
# <details><summary>Show the answer</summary>
#
# Only the linear layers are quantized. The embedding table (15 % of its parameters), the norms and the biases
# stay 16-bit, and the tied lm_head shares the embedding. 85 % of the weights shrink to a quarter, 15 % do not:
# 0.85 × 25 % + 0.15 × 100 % ≈ 36 %.
# </details>
#
# 2. The same LoRA adapter (r = 16, seven projections) trains 3.5 % of the 135M stand-in but 0.81 % of Qwen3-4B
#    (peft's `trainable%`). Why?
#
# <details><summary>Show the answer</summary>
#
# An adapter on a d × d matrix has 2rd numbers against d² weights: its share is 2r/d, which falls as the model
# gets wider (576 against 2,560). Small models carry relatively bigger adapters.
# </details>
#
# 3. `get_memory_footprint()` says your 4-bit model takes 1.12 GB. Is that the memory it needs to run?
#
# <details><summary>Show the answer</summary>
#
# No, it is the lower bound. It counts parameters and buffers only: NF4's per-block scales (one float32 per 64
# weights, 82 MB for this model) are not in it, nor are activations, the KV cache during generation, or the CUDA
# context. During QLoRA add the adapter, its gradients and its optimizer states, and the activations.
# </details>
#
# 4. On a laptop CPU you call `generate` on a freshly loaded 4-bit model, then start QLoRA training, and the first
#    step fails with "a view of a leaf Variable that requires grad...". What happened, and what are the two fixes?
#
# <details><summary>Show the answer</summary>
#
# On CPUs with AVX-512-bf16, bitsandbytes repacks 4-bit weights for fast inference on their first no-grad
# forward, and repacked weights cannot be trained. Either set `support_avx512bf16_for_cpu = False` on every
# `Linear4bit` before generating (`models.keep_4bit_trainable_on_cpu`), or train first and generate afterwards.
# </details>

# %% [markdown]
# ## Recap
#
# - `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=...)` quantizes every
#   linear layer while loading; the embedding table, norms and biases stay 16-bit.
# - So a 4-bit model is about a third of its 16-bit size, not a quarter: 41 % for SmolLM2-135M (269.0 → 109.8 MB),
#   36 % for Qwen2.5-1.5B-Instruct (3.09 → 1.12 GB, computed). The bigger the model, the closer to 25 %.
# - The meta device gives any model's exact sizes and counts from its config, without downloading it.
# - QLoRA = a frozen 4-bit base + a small LoRA adapter. With r = 16 on the seven projections: 0.82 % of Qwen3-4B,
#   but 3.6 % of a 135M model, because an adapter's share of a matrix is about 2r/d.
# - A stand-in with the real architecture and random weights gives real sizes, counts and training mechanics,
#   and nothing else: its text is noise.
#
# Next, mixed precision: fast 16-bit maths while the master weights stay in float32.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: CPU time depends on the machine.
print(f"CPU time of this notebook's kernel since the first code cell after setup: {time.process_time() - cpu_start:.0f} s")
