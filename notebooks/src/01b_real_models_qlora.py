# %% [markdown]
# # Real models in 4 bits, and QLoRA
#
# Notebook 01 quantized one weight matrix by hand. Here you quantize a whole language model, see where its
# memory goes, and fine-tune it the QLoRA way: a frozen 4-bit model with a small trainable adapter on top.
#
# **What you will be able to do**
# - load a language model in 16 bits and in 4-bit NF4 with one `BitsAndBytesConfig`, and read its footprint;
# - explain, part by part, why a 4-bit model is about a third of its 16-bit size, not a quarter;
# - compute the size of a model you cannot download, from its architecture alone;
# - set up QLoRA with `peft`, count what it trains, and run a few training steps.
#
# Runs on a laptop CPU or a free Colab GPU. **Before you start:** notebook 01 (scale, blocks of 64, NF4).

# %% [setup] extras=["peft"]

# %% [markdown]
# ## Why: one matrix is not a model
#
# Take a real model, Alibaba's `Qwen/Qwen2.5-1.5B-Instruct`: load it twice, in 16 bits and in 4-bit NF4, and
# compare `get_memory_footprint()`. Two things happen that one matrix cannot show you:
#
# 1. **Not every layer is quantized.** The 4-bit model is about a *third* of the 16-bit one, not a quarter.
# 2. **You cannot train 4-bit weights**, yet you can fine-tune a 4-bit model: QLoRA freezes it and trains a
#    small 16-bit adapter beside it.

# %% [markdown]
# ### The real model, or a stand-in?
#
# This notebook loads a model small enough for any laptop: **SmolLM2-135M-Instruct**, a 135-million-parameter
# chat model by Hugging Face, downloaded from the Hugging Face Hub. Its larger cousins (Qwen2.5-1.5B, Qwen3-4B,
# Llama 3) are *computed* from their architecture instead of loaded.
#
# Without the Hub (no internet), it uses a **stand-in**: the same architecture, rebuilt from its config file
# (shipped in `data/configs`) with *random* weights, then loaded through the same calls. Its sizes and counts
# are real; the text it writes is noise, and every line it prints says so. One quick connection attempt decides.

# %%
import time

import torch

from course_utils import footprint, lora, models, standin
from course_utils.progress import status, steps
from course_utils.units import format_bytes

cpu_start = time.process_time()
status("Choosing the model: the real SmolLM2-135M-Instruct if the Hub answers, else the stand-in …")
choice = standin.choose_model()  # the stand-in is built once, on first use, and cached
print(choice.label)
print("why:", choice.reason)

# %% [markdown]
# ## How it works: which parts get 4 bits?
#
# `load_in_4bit=True` replaces every `nn.Linear` layer of the model, except the output head, by a `Linear4bit`
# from bitsandbytes (the library behind 4-bit loading in transformers). Everything else keeps its 16-bit dtype:
# the **embedding table**, the **norms**, any **biases**. To see what that means, build the architecture on
# PyTorch's *meta* device: tensors with shapes but no data, so even a 70-billion-parameter model costs no memory.

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
# table's matrix. (A model with an untied head keeps a second vocabulary-sized matrix in 16 bits.)
#
# Bigger models get closer to a quarter: their linear layers grow with width × width, the embedding table only
# with vocabulary × width. The same count for Meta's Llama 3 at 8 and 70 billion parameters, from the shapes in
# their config files (untied heads; grouped-query attention, where 8 key/value heads serve all query heads):

# %%
for config, name in ((standin.STANDIN_CONFIG, "SmolLM2-135M"), (footprint.LLAMA3_8B, "Llama-3-8B"),
                     (footprint.LLAMA3_70B, "Llama-3-70B")):
    print(footprint.config_ratio_report(config, name), end="\n\n")

# %% [markdown]
# ## Interactive demo: how close to a quarter?
#
# Move the sliders: a Llama-shaped model (the MLP 8/3 times wider than the model) with your width, depth,
# vocabulary and key/value width. The 4-bit share falls towards 25 % as the model gets wider and deeper, and
# rises when the vocabulary grows or the head is untied. (The instructor's live demo; the cell above gives three
# fixed points.)

# %% tags=["nbval-ignore-output"] nbval_reason="a live widget; it needs a Jupyter front end to display."
from course_utils.widgets.models import four_bit_ratio_panel

four_bit_ratio_panel()

# %% [markdown]
# ## Benefits and trade-offs
#
# **Benefits**
# - Weights in linear layers take 0.5 byte instead of 2: SmolLM2-135M drops from 269.0 MB to 109.8 MB, the
#   Qwen2.5-1.5B-Instruct from 3.09 GB to 1.12 GB (both below).
# - QLoRA fine-tunes a model whose 16-bit weights would not fit: the base stays frozen in 4 bits and only a small
#   adapter gets gradients and optimizer states.

# %% [markdown]
# **Trade-offs**
# - Not a quarter: embeddings, norms and biases stay 16-bit, and NF4 stores one float32 scale per 64 weights on
#   the side (0.5 bit per weight, which `get_memory_footprint()` does not count).
# - Some quality loss, larger for small models. Measure your task again after quantizing.
# - Not always faster: every 4-bit weight is unpacked to 16 bits before the maths.
# - Small models carry relatively bigger adapters (below): QLoRA's "under 1 %" is a big-model figure.

# %% [markdown]
# ## In practice: one loading call, in 16 and 4 bits
#
# First the library itself. `AutoModelForCausalLM.from_pretrained` takes a Hub id or a folder. The 16-bit dtype
# comes from the device: bfloat16 on a CPU and on GPUs of compute capability 8.0 or more (A100, L4, H100),
# float16 on a T4, which has no bfloat16 tensor cores. `device_map` puts all the weights on the GPU if there is one
# (one GPU: `"auto"` would spread them over two, and the peaks below are read on one).

# %%
from transformers import AutoModelForCausalLM, AutoTokenizer

from course_utils.hardware import autocast_dtype, pick_device
from course_utils.quiet import quiet_libraries

device = pick_device()  # the first CUDA GPU, else the CPU
dtype = autocast_dtype(device)  # bfloat16, or float16 on a T4
device_map = {"": 0} if device.type == "cuda" else "cpu"  # "": the whole model, on GPU 0 (the first)
with quiet_libraries():  # keeps progress bars and library notices out of the output
    direct_16 = AutoModelForCausalLM.from_pretrained(choice.name, dtype=dtype, device_map=device_map)
    tokenizer = AutoTokenizer.from_pretrained(choice.name)
print(f"{choice.label} 16-bit: {format_bytes(direct_16.get_memory_footprint())}, weights in {direct_16.dtype}")

# %% [markdown]
# The course wraps that call in a helper, `models.load_model`, which picks the same settings for the device the
# notebook runs on. The rest of the notebook uses the helper; first, check that it does the same.

# %%
model_16 = models.load_model(choice, bits=16)  # the same from_pretrained call, settings from the device
fp16 = model_16.get_memory_footprint()
print(f"models.load_model(choice, bits=16): {format_bytes(fp16)}, weights in {model_16.dtype}")
print("same dtype and footprint as the direct call:",
      model_16.dtype == direct_16.dtype and fp16 == direct_16.get_memory_footprint())

# %% [markdown]
# For 4 bits, one more argument: a `BitsAndBytesConfig`. It quantizes each linear layer to NF4 as
# it loads (notebook 01's format) and unpacks it to the 16-bit dtype for the maths. 4 bits need the
# bitsandbytes package, which does not install on every machine: without it, each 4-bit cell prints one line
# saying what it skipped, and the 4-bit size is computed from the parts instead of measured.

# %%
from transformers import BitsAndBytesConfig

no_4bit = models.bitsandbytes_missing()  # None where bitsandbytes works, else why the 4-bit steps are skipped
if no_4bit:
    direct_4 = None
    print(f"4-bit load skipped: {no_4bit}.")
else:
    status("Loading in 4 bits: every linear layer is quantized as it loads …")
    bnb_config = BitsAndBytesConfig(
        load_in_4bit=True,              # store the linear layers' weights in 4 bits
        bnb_4bit_quant_type="nf4",      # the 4-bit format QLoRA uses
        bnb_4bit_compute_dtype=dtype,   # unpacked to 16 bits for the maths
    )
    with quiet_libraries():
        direct_4 = AutoModelForCausalLM.from_pretrained(choice.name, quantization_config=bnb_config,
                                                        dtype=dtype, device_map=device_map)
    print(f"{choice.label} 4-bit: {format_bytes(direct_4.get_memory_footprint())}, "
          f"{models.quantized_layer_count(direct_4)} linear layers in 4 bits")

# %%
if no_4bit:
    model_4, fp4 = None, footprint.footprint_bytes(model_16, 4)
    print(f"{choice.label} 4-bit: {format_bytes(fp4)}  COMPUTED from the parts ({100 * fp4 / fp16:.0f} % of 16-bit)")
else:
    status("The same 4-bit load through the helper …")
    started = time.perf_counter()
    model_4 = models.load_model(choice, bits=4)  # builds the same BitsAndBytesConfig: models.quantization_config(4)
    load_4_s = time.perf_counter() - started
    fp4 = model_4.get_memory_footprint()
    print(f"models.load_model(choice, bits=4): {format_bytes(fp4)} ({100 * fp4 / fp16:.0f} % of 16-bit), "
          f"{models.quantized_layer_count(model_4)} linear layers in 4 bits")
    print("same BitsAndBytesConfig, layers and footprint as the direct call:",
          model_4.config.quantization_config.to_dict() == direct_4.config.quantization_config.to_dict()
          and models.quantized_layer_count(model_4) == models.quantized_layer_count(direct_4)
          and fp4 == direct_4.get_memory_footprint())

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
# ### Qwen2.5-1.5B-Instruct, computed
#
# Its config file ships with the course, so its sizes can be computed on the meta device: no download, no GPU.
# These are **computed**, not loaded; "Going deeper" loads it on a GPU and measures the same numbers.

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

loaded = "stand-in, loaded" if choice.is_standin else "real, loaded"
if model_4 is not None:
    parts_4, how_4 = footprint.footprint_parts(model_4, 4), loaded
else:
    parts_4, how_4 = footprint.footprint_parts(model_16, 4), "computed"
fig = P.footprint_chart([
    (f"SmolLM2-135M 16-bit ({loaded})", footprint.footprint_parts(model_16, 16), fp16),
    (f"SmolLM2-135M 4-bit ({how_4})", parts_4, fp16),
    ("Qwen2.5-1.5B 16-bit (computed)", footprint.footprint_parts(qwen, 16), footprint.footprint_bytes(qwen, 16)),
    ("Qwen2.5-1.5B 4-bit (computed)", footprint.footprint_parts(qwen, 4), footprint.footprint_bytes(qwen, 16)),
])

# %% [markdown]
# **Text description of the chart.** Four horizontal stacked bars, each a percentage of the same model's 16-bit
# footprint, with a dashed line at 25 %. Red is the embedding table (16-bit), blue the linear layers, grey the
# norms, biases and buffers (too thin to see). SmolLM2-135M (loaded): 16-bit 269.0 MB, 4-bit 109.8 MB (41 %),
# of which the embedding table is 56.6 MB, 21 points. Qwen2.5-1.5B (computed): 16-bit 3.09 GB, 4-bit 1.12 GB
# (36 %), of which the embedding table is 0.47 GB, 15 points. In both 4-bit bars the blue part shrinks to a
# quarter; the red part does not, so neither gets down to the 25 % line.

# %% [markdown]
# ### Your turn: a 4-bit size by hand
#
# Qwen3-4B-Instruct-2507, the model of the Unsloth example below, has 4,022,468,096 parameters:
# 3,633,315,840 in linear layers, an embedding table of 388,956,160 (151,936 tokens × 2,560; its lm_head is
# tied to it) and 196,096 in norms. What is its size in 4 bits, in GB (10⁹ bytes), as `get_memory_footprint()`
# counts it (without the NF4 scales)?

# %%
from course_utils.exercises.qlora import check_four_bit_size

answer_gb = ...  # Qwen3-4B-Instruct-2507 in 4 bits, in GB
check_four_bit_size(answer_gb)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# Linear layers at half a byte, everything else at 2 bytes; the tied lm_head adds nothing:
# 3,633,315,840 × 0.5 + (388,956,160 + 196,096) × 2 = 1,816,657,920 + 778,304,512 = 2,594,962,432 bytes
# ≈ **2.59 GB**, 32 % of its 8.04 GB in 16 bits (a few hundred bytes of buffers do not change that). Closer to a
# quarter than Qwen2.5-1.5B's 36 %: the same vocabulary, but a model 2.6 times bigger. The course's own count:
# `footprint.computed_sizes(models.QWEN3_CONFIG).summary()`.
# </details>

# %% [markdown]
# ### Ask it a question
#
# Ask the 4-bit model to complete "The capital of France is". The real model answers; the stand-in's
# random weights produce noise. Noise can contain control characters, so the line shows them escaped
# (`\x12`), never raw.

# %% tags=["nbval-ignore-output"] nbval_reason="the stand-in's noise depends on the CPU's rounding; the real model's answer on its weights."
asked, width = (model_4, "4-bit") if model_4 is not None else (model_16, "16-bit (no 4-bit model here)")
status(f"Asking the {width} model, 10 tokens …")
started = time.perf_counter()
answer = models.generate_text(asked, tokenizer, "The capital of France is", max_new_tokens=10)
print(choice.show_text(answer))
print(f"({time.perf_counter() - started:.1f} s)")

# %% [markdown]
# ## QLoRA: a frozen 4-bit base and a small 16-bit adapter
#
# LoRA leaves a weight matrix W (d_out × d_in) frozen and learns a low-rank change beside it: B·A, with A of
# size r × d_in and B of size d_out × r. Only A and B are trained. With QLoRA, W is the 4-bit weight; A and B
# are ordinary 16- or 32-bit tensors. From scratch, for one attention matrix of SmolLM2-135M:

# %%
d_in, d_out, r = 576, 576, 16  # q_proj of SmolLM2-135M, rank 16 as above
print(f"q_proj: {d_in * d_out:,} frozen weights; adapter A ({r}x{d_in}) + B ({d_out}x{r}) = "
      f"{r * (d_in + d_out):,} trainable numbers ({100 * r * (d_in + d_out) / (d_in * d_out):.1f} % of the matrix)")

# %% [markdown]
# Now the library: `peft`, Hugging Face's library of adapters such as LoRA, in three calls. `LoraConfig` says where
# the adapters go: rank 16, alpha 16, the seven projections. `prepare_model_for_kbit_training` readies a 4-bit model
# for training (the parts that stay 16-bit go to float32; on a GPU it also turns on gradient checkpointing).
# `get_peft_model` freezes the model and adds the adapters. Without bitsandbytes the adapter goes on the 16-bit
# model: plain LoRA.

# %%
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

from course_utils.architecture import PROJECTIONS  # q, k, v, o, gate, up, down

lora_config = LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=list(PROJECTIONS),
                         task_type="CAUSAL_LM")
torch.manual_seed(0)  # the A matrices start random: a fixed training seed makes every run start the same
with quiet_libraries():
    base = direct_4 if direct_4 is not None else direct_16
    if direct_4 is not None:
        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=device.type == "cuda",
                                               gradient_checkpointing_kwargs={"use_reentrant": False})
    direct_qlora = get_peft_model(base, lora_config)
print(choice.label)
direct_qlora.print_trainable_parameters()

# %% [markdown]
# The helper `lora.add_lora` makes the same three calls (and fixes the adapters' random start without touching
# the notebook's random state). It wraps the helper's 4-bit model, the one the training below uses:

# %%
qlora = lora.add_lora(model_4 if model_4 is not None else model_16, r=16, alpha=16, targets=PROJECTIONS)
trainable, total = lora.trainable_counts(qlora)
print(f"lora.add_lora: trainable params: {trainable:,} || all params: {total:,}")
print("same counts and same starting adapter weights as the direct calls:",
      lora.trainable_counts(direct_qlora) == (trainable, total) and lora.same_adapters(qlora, direct_qlora))
print(f"by hand, r x (d_in + d_out) summed over the targeted layers: {lora.lora_params_by_hand(qlora, 16):,}")
del direct_qlora, base, direct_4, direct_16  # the direct calls' models are no longer needed

# %% [markdown]
# ### Your turn: count a smaller adapter
#
# Rank 8 on `q_proj` and `v_proj` only, in every decoder layer of SmolLM2-135M: how many trainable numbers?
# Read the two layers' shapes in the decoder layer printed near the top.

# %%
from course_utils.exercises.qlora import check_lora_count

answer = ...  # trainable numbers of LoRA rank 8 on q_proj and v_proj, all layers
check_lora_count(answer)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# q_proj maps 576 → 576: 8 × (576 + 576) = 9,216. v_proj maps 576 → 192 (3 key/value heads of 64):
# 8 × (576 + 192) = 6,144. Per layer 15,360; over 30 layers **460,800**, 0.34 % of the model.
# The course's count: `lora.lora_count(standin.STANDIN_CONFIG, r=8, targets=["q_proj", "v_proj"]).summary()`.
# </details>

# %% [markdown]
# ### "Under 1 %"? That depends on the model
#
# Unsloth's QLoRA example (below) promises under 1 % trainable parameters. Two percentages are in use, so here is
# which is which. peft's `trainable%` divides the adapter by **all** parameters, base + adapter; the bracket
# divides by the **base alone**. Counted on the meta device from the real configs:

# %%
for config, label in ((standin.STANDIN_CONFIG, "SmolLM2-135M"), (models.QWEN25_CONFIG, "Qwen2.5-1.5B-Instruct"),
                      (models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507")):
    print(lora.lora_count(config, r=16, alpha=16, targets=PROJECTIONS, name=label).summary())

# %% [markdown]
# The same adapter trains 3.50 % of SmolLM2-135M's parameters but 0.81 % of Qwen3-4B's (peft's `trainable%`;
# of the base alone, 3.63 % and 0.82 %). Why? For a d × d matrix the adapter holds r·(d + d) = 2rd numbers
# against d² weights: a share of **2r / d**, which falls as the model gets wider. (Over the whole model the
# share is lower, because the embedding table gets no adapter.)

# %%
for label, width in (("SmolLM2-135M", 576), ("Qwen2.5-1.5B", 1536), ("Qwen3-4B", 2560)):
    print(f"{label:13} width {width:5}: a square matrix's adapter is 2r/d = {100 * 2 * 16 / width:.2f} % of it")

# %% [markdown]
# ### A few real training steps
#
# The training data is 40 short lines shipped with the course (`data/standin/train.jsonl`). The loop is plain
# PyTorch: the optimizer sees only the adapter's parameters, and the gradients never touch the 4-bit weights.
# The learning rate, 2e-3, is on the high side (QLoRA recipes often use 1e-4 to 2e-4 over thousands of steps);
# it makes eight steps of a demo visible.

# %% [markdown] slide="notes"
# On a T4 the base computes in float16, whose small gradients can round to zero, so the loss is scaled up for
# the backward pass (`GradScaler`, switched on by one flag; notebook 02 explains it). In bfloat16, on a CPU or
# a newer GPU, the flag is off and the scaler does nothing.
#
# The exact losses differ in their last digits from one CPU or GPU to another (16-bit sums are added up in a
# different order), so the check below asks for a drop of more than 10 %: far above those differences, far
# below the drop itself, for the stand-in and the real model alike. The raw numbers come in the cell after it.

# %%
device = next(qlora.parameters()).device
batches = models.training_batches(tokenizer, models.training_texts(), batch_size=8, max_length=24, device=device)
print(f"{choice.label} {len(batches)} batches of up to 8 lines")
status("Measuring the loss over the 40 lines before training (no gradients) …")
before = models.mean_loss(qlora, batches)

# %%
from course_utils.hardware import needs_loss_scaling

optimizer = torch.optim.AdamW([p for p in qlora.parameters() if p.requires_grad], lr=2e-3)
scaler = torch.amp.GradScaler(device.type, enabled=needs_loss_scaling(autocast_dtype(device)))  # on for float16
losses, started = [], time.perf_counter()
qlora.train()
with steps("Training", total=8) as step:
    for i in range(8):
        step(f"batch {i % len(batches) + 1} of {len(batches)}")
        loss = qlora(**batches[i % len(batches)]).loss
        scaler.scale(loss).backward()  # gradients reach the adapters only: the base is frozen
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
train_s = time.perf_counter() - started
print(f"{choice.label} 8 steps done, loss scaling {'on' if scaler.is_enabled() else 'off'}")

# %%
status("Measuring the loss over the 40 lines after training …")
after = models.mean_loss(qlora, batches)
print("mean loss over the 40 lines fell by more than 10 %:", after < 0.9 * before)

# %% tags=["nbval-ignore-output"] nbval_reason="losses and generated text differ in the last digits from one CPU (or GPU) to another."
print(f"{choice.label} mean loss before {before:.2f}, after {after:.2f}")
print("loss per step:", " ".join(f"{x:.2f}" for x in losses))
status("Asking again after training, 10 tokens …")
print("after training:", choice.show_text(models.generate_text(qlora, tokenizer, "The capital of France is",
                                                                max_new_tokens=10)))

# %% [markdown]
# The stand-in starts a little above the loss of a uniform guess over its vocabulary (ln 49,152 ≈ 10.8), and
# its adapter quickly learns which few tokens the training text uses; afterwards it typically repeats one
# frequent word. It still knows nothing about France: eight steps on 40 lines teach a format, not facts. The
# real model starts much lower: it already knows English.

# %% [markdown]
# ### The Unsloth version
#
# Unsloth, an open-source library of faster GPU kernels for fine-tuning, wraps the same two steps (a 4-bit base,
# then LoRA on the seven projections). It needs a CUDA GPU and downloads `unsloth/Qwen3-4B-Instruct-2507`. It
# patches torch, transformers and peft when imported, so it must be installed in a *fresh* runtime, before
# anything else runs. The cell runs only where Unsloth is already installed; elsewhere it says what to do.

# %%
from course_utils.unsloth import unsloth_plan

plan = unsloth_plan(choice)
print(plan.message())
if plan.run:
    from unsloth import FastLanguageModel

    model_u, tokenizer_u = FastLanguageModel.from_pretrained(
        model_name="unsloth/Qwen3-4B-Instruct-2507", max_seq_length=2048, load_in_4bit=True)  # frozen 4-bit base
    model_u = FastLanguageModel.get_peft_model(model_u, r=16, lora_alpha=16, target_modules=list(PROJECTIONS))
    model_u.print_trainable_parameters()  # the meta-device count above: 33,030,144 trainable, 0.81 %

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

# %% [markdown]
# 2. The same LoRA adapter (r = 16, seven projections) trains 3.50 % of SmolLM2-135M's parameters but 0.81 % of
#    Qwen3-4B's (peft's `trainable%`: adapter ÷ all parameters). Why?
#
# <details><summary>Show the answer</summary>
#
# An adapter on a d × d matrix has 2rd numbers against d² weights: its share is 2r/d, which falls as the model
# gets wider (576 against 2,560). Small models carry relatively bigger adapters.
# </details>

# %% [markdown]
# 3. `get_memory_footprint()` says your 4-bit model takes 1.12 GB. Is that the memory it needs to run?
#
# <details><summary>Show the answer</summary>
#
# No, it is the lower bound. It counts parameters and buffers only: NF4's per-block scales (one float32 per 64
# weights, 82 MB for this model) are not in it, nor are activations, the KV cache during generation, or the CUDA
# context. During QLoRA add the adapter, its gradients and its optimizer states, and the activations.
# </details>

# %% [markdown]
# ## Recap
#
# - A `BitsAndBytesConfig` (NF4) passed to `from_pretrained` quantizes every linear layer while loading; the
#   embedding table, norms and biases stay 16-bit.
# - So a 4-bit model is about a third of its 16-bit size: 41 % for SmolLM2-135M (269.0 → 109.8 MB), 36 % for
#   Qwen2.5-1.5B (3.09 → 1.12 GB). The bigger the model, the closer to 25 %.
# - The meta device gives a model's exact sizes from its config alone.
# - QLoRA = a frozen 4-bit base (`prepare_model_for_kbit_training`) + a LoRA adapter (`LoraConfig`,
#   `get_peft_model`). At r = 16 on the seven projections it trains 3.50 % of SmolLM2-135M but 0.81 % of
#   Qwen3-4B (peft's `trainable%`, of all parameters): an adapter's share of a matrix is about 2r/d.
#
# Next, mixed precision: fast 16-bit maths while the master weights stay in float32.

# %% [markdown]
# ## Going deeper (optional)
#
# Machine details, Qwen2.5-1.5B-Instruct itself on a GPU, and a longer exercise. None of it is needed for notebook 02.

# %% [markdown]
# ### A CPU pitfall: 4-bit weights repacked for inference
#
# On CPUs with AVX-512-bf16 (recent Intel Xeons), bitsandbytes repacks 4-bit weights into a faster inference
# layout the first time they run without gradients (a `generate`), and repacked weights can no longer be
# trained: the next training step fails with "a view of a leaf Variable that requires grad...". Two fixes:
# set `support_avx512bf16_for_cpu = False` on every `Linear4bit` before generating
# (`models.keep_4bit_trainable_on_cpu`, which `models.load_model` already calls for a 4-bit model), or train
# first and generate afterwards. It costs only CPU generation speed; on a GPU it changes nothing.

# %%
if model_4 is None:
    print(f"4-bit repacking switch skipped (there are no 4-bit layers): {no_4bit}.")
else:
    print(choice.label, "4-bit layers kept trainable:", models.keep_4bit_trainable_on_cpu(model_4))

# %% [markdown]
# **Check yourself.** On a laptop CPU you call `generate` on a 4-bit model loaded with a plain
# `from_pretrained`, then start QLoRA training, and the first step fails with the error above. What happened?
#
# <details><summary>Show the answer</summary>
#
# The CPU has AVX-512-bf16: the no-grad `generate` repacked the 4-bit weights for fast inference, and repacked
# weights cannot be trained. Load the model again and switch the repacking off before generating, or train first.
# </details>

# %% [markdown] slide="notes"
# ### On a GPU: what changes
#
# With a CUDA GPU (a Colab T4 is enough) every cell above runs on it: 16-bit (bfloat16 on Ampere or newer,
# float16 on a T4) and 4-bit loads on that one GPU, QLoRA with gradient checkpointing, the same eight
# training steps (with loss scaling on a T4), and the Unsloth cell if Unsloth was installed in a fresh runtime.
# bitsandbytes also runs NF4 on a CPU, which is how the saved
# outputs of this notebook were made; the timing cell at the end shows why a CPU is for demos only.

# %% [markdown]
# With a GPU and the Hub, the next cell also loads Qwen2.5-1.5B-Instruct itself, in 4 bits, and
# measures what the meta device computed above: about 1.1 GB.

# %%
from course_utils.hub import LESSON_MODEL

why_not = standin.lesson_model_skip_reason(choice, no_4bit)
if why_not:
    print(f"{LESSON_MODEL} not loaded: {why_not}.")
else:
    status(f"Loading {LESSON_MODEL} in 4 bits (a 3 GB download the first time) …")
    qwen_4 = models.load_model(LESSON_MODEL, bits=4)
    measured = qwen_4.get_memory_footprint()
    print(f"[{LESSON_MODEL}] 4-bit, measured: {format_bytes(measured)}; computed on the meta device: "
          f"{format_bytes(footprint.footprint_bytes(qwen, 4))}")
    qwen_tokenizer = models.load_tokenizer(LESSON_MODEL)
    qwen_answer = models.generate_text(qwen_4, qwen_tokenizer, "The capital of France is", max_new_tokens=10)
    print(f"[{LESSON_MODEL}] answer: '{models.printable(qwen_answer)}'")
    del qwen_4

# %% [markdown]
# ### Run it yourself: check your answers with the course's counters
#
# Compute Qwen3-4B-Instruct-2507's 16-bit and 4-bit sizes and its breakdown (your first exercise), and count the
# rank-8 adapter on `q_proj` and `v_proj` (your second) on SmolLM2-135M and on Qwen3-4B.

# %%
# Your code here. Useful: footprint.computed_sizes, footprint.breakdown_table, models.meta_model,
# lora.lora_count(..., r=8, targets=[...])

# %% [markdown]
# <details><summary>Show the answer</summary>
#
# ```python
# print(footprint.computed_sizes(models.QWEN3_CONFIG, "Qwen3-4B-Instruct-2507").summary())
# print(footprint.breakdown_table(models.meta_model(models.QWEN3_CONFIG), low_bits=4))
# for config in (standin.STANDIN_CONFIG, models.QWEN3_CONFIG):
#     print(lora.lora_count(config, r=8, alpha=16, targets=["q_proj", "v_proj"]).summary())
# ```
#
# Qwen3-4B-Instruct-2507: 8.04 GB in 16 bits, 2.59 GB in 4 bits, **32 %**; its NF4 scales add another 0.23 GB.
# Rank 8 on q_proj and v_proj trains 460,800 numbers on SmolLM2-135M (trainable% 0.34) and 2,949,120 on
# Qwen3-4B (trainable% 0.07), against 33,030,144 (0.81 %) for the Unsloth example's adapter on all seven.
# </details>

# %% tags=["nbval-ignore-output"] nbval_reason="times depend on the machine and its load."
if model_4 is not None:
    print(f"4-bit load through the helper: {load_4_s:.1f} s (it quantizes every linear layer)")
print(f"8 training steps: {train_s:.1f} s ({train_s / 8:.2f} s per step)")
print(f"CPU time of this notebook's kernel since the first code cell after setup: {time.process_time() - cpu_start:.0f} s")
