# %% [markdown]
# # Quantization: keep fewer digits
#
# Your GPU's memory is a backpack; the model's weights are its heaviest books. Quantization swaps hardcovers
# for paperbacks: each weight gets fewer bits, at a small cost in accuracy.
#
# **You will be able to** quantize numbers by hand, count the bytes a quantized tensor (array) takes,
# measure what 8, 4, 3 and 2 bits do to a trained network, and choose how many weights share a scale.
#
# It all runs on a laptop CPU: sizes and errors are arithmetic, the same on a GPU.

# %% [setup]
# %% [markdown]
# ## Why quantize?
#
# A smaller model needs less memory and can answer faster. We write π as 3.14, not 3.14159265; quantization
# keeps fewer digits of each weight too. In float32, the default format, a weight takes 32 bits (4 bytes);
# bfloat16 is a 16-bit float, int8 and int4 are 8- and 4-bit integers. A model with 7 billion weights (7B):

# %%
params = 7_000_000_000
for name, bits in [("float32", 32), ("bfloat16", 16), ("int8", 8), ("int4", 4)]:
    print(f"{name:<9} {bits:>2} bits: {params * bits / 8 / 1e9:5.1f} GB")

# %% [markdown]
# From 28 GB (a data-centre GPU) to 3.5 GB (a laptop GPU).
#
# ## How it works
#
# Snap every number to the nearest of a few evenly spaced **levels**. The **scale** $s$ is the gap between
# levels; the **zero-point** $z$ shifts them when the numbers are not centred on zero.
#
# - Quantize: store the small integer $q = \mathrm{round}(x / s) + z$.
# - Read back (dequantize): $\hat{x} = s\,(q - z)$. The gap $\hat{x} - x$ is the **quantization error**.
#
# For int8 (8-bit integers) with $z = 0$, $s = \max|x| / 127$: the largest $|x|$ lands exactly on ±127, and
# no number moves more than half a step.

# %%
import torch

x = torch.tensor([0.5, -1.27, 0.02, 1.0])
s = x.abs().max() / 127  # 1.27 / 127 = 0.01
q = torch.round(x / s)   # the integers we store
print("scale", round(s.item(), 6), "| stored", q.int().tolist(), "| read back", [round(v, 6) for v in (q * s).tolist()])

# %% [markdown]
# Multiples of 0.01 come back exactly. **A zero-point** helps lopsided numbers, say −0.2 to 2.35: levels
# centred on zero (**symmetric**) span −2.35…2.35 and waste all below −0.2; with $z$, levels 0…255 span
# exactly −0.2…2.35.

# %%
x = torch.tensor([-0.2, 0.0, 0.3, 1.0, 2.35])
s_sym = x.abs().max() / 127    # symmetric: levels -127..127
q_sym = torch.round(x / s_sym)
s = (x.max() - x.min()) / 255  # with a zero-point: levels 0..255
z = torch.round(-x.min() / s)  # the stored integer that means 0
q = torch.round(x / s) + z
print(f"symmetric:       s={s_sym:.5f}        q={q_sym.int().tolist()}  "
      f"average error {(q_sym * s_sym - x).abs().mean():.5f}")
print(f"with zero-point: s={s:.5f}  z={z:.0f}  q={q.int().tolist()}  average error {(s * (q - z) - x).abs().mean():.5f}")

# %% [markdown]
# The symmetric step is nearly twice as big. A zero-point costs one more small integer per scale.
#
# ## Quantize eight numbers
#
# Eight made-up weights in 4 bits. Four bits allow 16 values; like int8 above, we use the symmetric steps
# −7…7. The weight furthest from zero is −0.35, so one step is 0.35 ÷ 7 = 0.05.
#
# **Predict before you run**: which weights come back exactly? How far can any weight move?

# %%
w = torch.tensor([0.12, -0.05, 0.31, -0.22, 0.02, -0.35, 0.18, 0.07])  # float32
s = w.abs().max() / 7  # one step: 0.05
q = torch.round(w / s)  # stored steps, -7..7
w_hat = q * s           # read back
print("weight     ", " ".join(f"{v:5.2f}" for v in w.tolist()))
print("stored step", " ".join(f"{v:5d}" for v in q.int().tolist()))
print("read back  ", " ".join(f"{v:5.2f}" for v in w_hat.tolist()))
print("error      ", " ".join(f"{v:+5.2f}" for v in (w_hat - w).tolist()))
print(f"float32: {w.nbytes} bytes | 4-bit: {w.numel() * 4 // 8} bytes of steps + {s.element_size()} for the step")

# %% [markdown]
# −0.05 and −0.35 come back exactly; no weight moves more than half a step. 32 bytes became 4, plus 4 for
# the step size. Real 4-bit formats share a step among 64 weights, and use better steps.

# %%
from course_utils.lessons import quantization as lesson

_ = lesson.plot_eight_numbers(bits=4)

# %% [markdown] slide="notes"
# **Text description of the chart.** Two rows of 8 dots on an axis from −0.4 to 0.4. The float32 row has the
# original weights: −0.35, −0.22, −0.05, 0.02, 0.07, 0.12, 0.18 and 0.31. The 4-bit row has the rounded
# values: −0.35, −0.20, −0.05, 0, 0.05, 0.10, 0.20 and 0.30. Every rounded value is a multiple of 0.05, and
# each dot is at most 0.02 from its original.

# %% [markdown]
# **Try it live**: move the slider. At 2 bits three levels are left; at 8 the dots barely move.

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget; nbval has no widget front end to compare it with."
lesson.eight_numbers_widget()

# %% [markdown]
# ### Run it yourself: int8 by hand
#
# Write `quantize_int8(x)`: symmetric int8 with one scale, returning the codes and the scale. The check
# tries four tensors, a matrix among them; in some the value furthest from zero is negative.

# %%
def quantize_int8(x):
    """Symmetric int8 with one scale: return (codes, scale)."""
    raise NotImplementedError  # your code: s = ..., q = ..., return q, s


lesson.check_quantize_int8(quantize_int8)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# ```python
# def quantize_int8(x):
#     s = x.abs().max() / 127   # the largest |x| lands on level ±127
#     q = torch.round(x / s)    # the nearest level; |x / s| <= 127, so no clamp is needed
#     return q, s
# ```
#
# Typical slips: dividing by 128 or 255 (the symmetric levels stop at ±127), `x.max()` instead of
# `x.abs().max()` (the extreme can be negative), `.int()` or `floor`, which cut the fraction off instead of
# rounding, and one scale per row instead of one for the whole tensor.
#
# </details>
#
# ## Benefits and trade-offs
#
# **Benefits**
# - 4-bit weights take about a quarter of the memory of 16-bit ones.
# - Faster text generation, where kernels read the 4-bit weights directly (GPU serving tools, named below;
#   recent bitsandbytes for a few tokens at a time): each new token reads every weight once, so memory traffic
#   sets the pace, and 4 bits are a quarter of 16-bit's bytes.
# - Bigger models fit on smaller, cheaper GPUs.

# %% [markdown]
# **Trade-offs**
# - Some quality loss: 8 bits are close to lossless, 4 bits lose a little, 3 and 2 bits a lot.
# - Small models suffer more than big ones.
# - Not always faster: it depends on the GPU, the software and the batch size. In training, with many tokens at
#   once, bitsandbytes' NF4 (next notebooks) unpacks each block of weights to 16 bits before multiplying: it
#   saves memory, not time. This notebook times nothing.
# - You cannot train quantized weights: a small update rounds away. QLoRA freezes a 4-bit model and trains
#   small adapters, usually called 16-bit; peft, used in the next notebook, keeps them in float32 by default,
#   as this course does.
#
# ## Same model, four formats
#
# A small network (64 pixels → 64 hidden units → 10 digits) learns scikit-learn's handwritten digits. We
# store its weights in each format (int ones symmetric, one scale per matrix) and score 450 unseen images:
# accuracy, and test loss (cross-entropy: how unsure it is of the right digit).

# %% [markdown] slide="notes"
# The network computes in float32 with the read-back weights: quality, not speed. Biases stay in float32.

# %%
from course_utils.digits import (evaluate, format_quality_table, linear_weight_count, load_digits_data,
                                 quality_by_format, train_digits_mlp)
from course_utils.progress import status

status("Loading the digits and training the network (float64 on one thread, then stored in float32) …")
data = load_digits_data()
model = train_digits_mlp(data, seed=0)  # deterministic: training seed 0, float64 on one thread
base = evaluate(model, data)
print(f"{len(data.y_train)} training images, {len(data.y_test)} test images, "
      f"{linear_weight_count(model):,} weights in 2 Linear layers")
print(f"float32 model: test accuracy {100 * base.accuracy:.1f}%, test loss {base.loss:.3f}")

# %% [markdown]
# **Predict before you run**: how many accuracy points will int8 lose? int4? int2, with three levels per matrix?

# %%
per_tensor = quality_by_format(model, data)
print(format_quality_table(per_tensor))

# %% [markdown]
# Down to int4 almost nothing is lost; int3 loses a lot, int2 everything. Weight bytes include the scales.
# Now one scale per output row (64 and 10 scales instead of 1):

# %%
per_row = quality_by_format(model, data, block_size="row")
print(format_quality_table(per_row))

# %%
_ = lesson.plot_quality_vs_bits({"one scale per tensor": per_tensor, "one scale per row": per_row})

# %% [markdown] slide="notes"
# **Text description of the chart.** Two line charts, formats float32, bfloat16, float16, int8, int4, int3
# and int2 on the horizontal axis, one line for each way of choosing scales. Left, test
# accuracy: with one scale per tensor 98.0%, 98.0%, 98.0%, 97.8%, 97.6%, 93.1% and 32.9%; with one scale per
# row 98.0%, 98.0%, 98.0%, 98.0%, 97.6%, 96.7% and 56.0%. Right, test loss on a log scale: per tensor 0.086,
# 0.087, 0.086, 0.087, 0.090, 0.190 and 2.331; per row 0.086, 0.087, 0.086, 0.086, 0.090, 0.122 and 1.310.
# Both lines stay flat to int4, then fall; per row falls less.

# %% [markdown]
# Finer scales rescue int3 for a few hundred bytes; int2 fails either way.
#
# **Try it live**: int3 with one scale per tensor, per row, then per 16 weights.

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget; nbval has no widget front end to compare it with."
lesson.format_widget(model, data)

# %% [markdown]
# ## In practice: a 4096 × 4096 weight matrix
#
# A language model is mostly matrices like this one: 16.8 million weights. Random normal numbers stand in for
# trained weights, and one scale serves the whole matrix.
#
# **Predict before you run**: int4 has 15 levels, int8 255, 17 times as many. Is int4's error about 2× int8's
# (half the bits) or about 17×?

# %%
_ = torch.manual_seed(0)
w = torch.randn(4096, 4096)  # a weight matrix in float32
print(f"float32: {w.nbytes / 1e6:.0f} MB")

errors = {}
for bits in (8, 4):
    q_max = 2 ** (bits - 1) - 1  # 127 for int8, 7 for int4
    s = w.abs().max() / q_max    # scale: the largest weight maps to q_max
    q = torch.round(w / s)       # quantize: q = round(x / s)
    w_hat = q * s                # dequantize: x ≈ q × s
    size = w.numel() * bits / 8 / 1e6
    error = (w - w_hat).abs().mean()
    errors[bits] = error
    print(f"int{bits}:    {size:.0f} MB, average error {error:.3f}")
print(f"int4's error / int8's: {errors[4] / errors[8]:.1f}x")

# %% [markdown]
# About 18×: the step is 127 / 7 ≈ 18.1 times bigger (15 levels span 14 steps, 255 span 254), and the average
# error is about a quarter of a step at both widths. Why so crude? `s` and `q` are still int4's:

# %%
print(f"largest |weight| {w.abs().max():.2f}, so the int4 step is {s:.3f}")
print(f"weights stored as -1, 0 or +1: {(q.abs() <= 1).float().mean():.1%}")

# %%
_ = lesson.plot_value_histograms(w, w_hat, label="int4, one scale")

# %% [markdown] slide="notes"
# **Text description of the chart.** Two histograms of every 83rd value. Left: the float32 values form a
# bell curve from about −4.7 to 5.3; their int4 read-backs pile up on spikes 0.757 apart, tallest at 0.
# Right: the errors spread evenly between −0.378 and +0.378.

# %% [markdown]
# A few rare outliers set the step for everyone, and most weights share three levels. Real 4-bit formats
# give **each block of 64 weights its own scale**: the largest of 64 normal numbers is usually about 2.6.

# %%
blocks = w.reshape(-1, 64)                      # 262,144 blocks of 64 weights
s = blocks.abs().amax(dim=1, keepdim=True) / 7  # one scale per block
w_hat = torch.round(blocks / s) * s
size = w.numel() * 4 / 8 + s.numel() * 4        # 4-bit codes + one float32 scale per block
print(f"int4, blocks of 64: {size / 1e6:.2f} MB, average error {(blocks - w_hat).abs().mean():.3f}")

# %% [markdown]
# Half the error; each weight carries 32 / 64 = 0.5 bits of scale.
#
# ### Run it yourself: count the bytes
#
# A 7B model's feed-forward matrix is 11008 × 4096. In int4 with one float32 scale per block of 64 weights,
# how many bytes does it take?

# %%
answer_bytes = ...  # bytes of the codes + bytes of the scales

lesson.check_int4_block_bytes(answer_bytes)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# 11008 × 4096 = 45,088,768 weights. Codes: 45,088,768 × 4 bits / 8 = 22,544,384 bytes. Scales:
# 45,088,768 / 64 = 704,512 blocks × 4 bytes = 2,818,048 bytes. Total **25,362,432 bytes** (25.4 MB), or
# 4.5 bits per weight. In float32 the matrix takes 180 MB.
#
# </details>
#
# **Try it live** on a 1024 × 1024 matrix: 4 bits with one scale, then blocks of 64, then untick "symmetric".

# %% tags=["nbval-ignore-output"] nbval_reason="an interactive widget; nbval has no widget front end to compare it with."
lesson.error_widget()

# %% [markdown]
# ### NF4: put the levels where the weights are
#
# Trained weights crowd near 0. **NF4** ("4-bit NormalFloat", QLoRA's format) packs its 16 levels close
# there and sparse in the tails, so each level serves about as many weights.

# %%
from course_utils import quant

levels = quant.nf4_levels()                      # NF4's 16 levels, from -1 to 1
print("NF4 levels:", [round(v, 2) for v in levels.tolist()])
absmax = blocks.abs().amax(dim=1, keepdim=True)  # each block's largest |weight| is its scale
codes = torch.bucketize(blocks / absmax, (levels[1:] + levels[:-1]) / 2)  # the nearest level, 0..15
w_hat = levels[codes] * absmax
print(f"nf4, blocks of 64:  {size / 1e6:.2f} MB, average error {(blocks - w_hat).abs().mean():.3f}")

# %% [markdown]
# Same size, a fifth less error.
#
# ## Real models in 4 bits, and QLoRA
#
# > **Continued in [the next notebook](01b_real_models_qlora.ipynb)**: SmolLM2-135M-Instruct loaded in 16 and
# > 4 bits, and Qwen2.5-1.5B-Instruct's two sizes computed from its config (4 bits give about a third of the
# > size, not a quarter: the embedding table stays in 16 bits); then QLoRA fine-tuning.

# %% [markdown] slide="notes"
# **Libraries you will meet**: bitsandbytes with Hugging Face Transformers (load any model in 8 or 4 bits),
# Unsloth (fine-tune in 4 bits with QLoRA), torchao (PyTorch's own quantization), llm-compressor and
# GPTQModel (make GPTQ or AWQ checkpoints), and vLLM, TensorRT-LLM, llama.cpp and Ollama (serve quantized
# models).

# %% [markdown]
# ## Knowledge check
#
# 1. Why is int4's error with one scale so large (0.189), and why do blocks of 64 help?
# 2. Values all lie between 0 and 6. Zero-point or not? Why?
# 3. A training step adds 0.0001 to a weight stored in int4 with a step of 0.05. What happens?
#
# <details><summary>Show the answers</summary>
#
# 1. The largest weight (5.30) sets the step, 0.757, while most weights lie between −1 and 1: three quarters
#    of them land on three levels. A block of 64 has a much smaller largest value (about 2.6), so its step is
#    smaller, and an outlier only coarsens its own block.
# 2. Yes. Symmetric levels would span −6…6 and waste the negative half; with a zero-point all the levels span
#    0…6, so the step and the error are half as big. The cost: one small integer per scale.
# 3. Nothing: the new value rounds back to the same level, so the update is lost. That is why QLoRA keeps
#    the 4-bit weights frozen and trains small adapters instead (16-bit, or float32 as peft keeps them).
#
# </details>
#
# ## Recap
#
# - $q = \mathrm{round}(x/s) + z$, $\hat{x} = s(q - z)$: no value moves more than half a step.
# - 4096²: float32 67 MB; int8 17 MB, error 0.010; int4 8 MB, error 0.189. Blocks of 64 halve int4's error
#   for 0.5 bits per weight; NF4 takes off another fifth. Scales count in the size.
# - A trained network: int8 lossless in practice, int4 a little worse, int3 and int2 much worse.
# - Quantization trades a little accuracy for a lot of memory. It shines when serving models; for training,
#   use mixed precision, or QLoRA to fine-tune.

# %% [markdown]
# ## Going deeper (optional)
#
# Zero-points against blocks, how NF4's levels are made, other training seeds, and bitsandbytes' own NF4.
#
# ### Zero-points and blocks, side by side
#
# The 4096 × 4096 matrix with every combination, sizes including every scale and zero-point (MB = 10⁶ bytes):

# %%
status("Quantizing 16.8 million weights 8 ways (4 schemes x 2 widths) …")
rows = quant.compare_schemes(w, bits_list=(4, 8))
print(quant.format_scheme_table(rows, float32_bytes=w.nbytes))

# %% [markdown]
# - **Blocks of 64** halve the error at both widths, for 0.5 extra bits per weight.
# - A **zero-point** helps a little on these centred numbers (16 levels instead of 15, spread from the
#   smallest to the largest value) and a lot on lopsided data, as in "How it works".
# - Each block's zero-point adds 0.13 MB at 4 bits and 0.26 MB at 8 bits.
#
# ### How NF4's 16 levels are made
#
# The recipe of `create_normal_map` in bitsandbytes, the library behind 4-bit loading in Hugging Face
# Transformers:
#
# 1. Probabilities. Positive side: 9 evenly spaced values from 0.9677 down to 0.5, minus 0.5 itself: 8.
#    Negative side: 8 values over the same range, minus 0.5: 7. (0.9677 is the average of 1 − 1/30 and
#    1 − 1/32; it keeps the outermost level finite.)
# 2. Turn each probability into a z-score with the inverse normal CDF (`torch.special.ndtri`): 0.9677 gives
#    about 1.85. The negative side gets a minus sign.
# 3. Add one exact 0, sort, and divide by the largest so the levels span −1…1.
#
# 8 + 7 + 1 = 16: an even number of levels cannot be symmetric *and* contain 0, so NF4 has one more positive
# level than negative ones.

# %%
offset = (1 - 1 / 30 + 1 - 1 / 32) / 2                        # 0.96770833...
positive = torch.linspace(offset, 0.5, 9, dtype=torch.float64)[:-1]  # 8 probabilities
negative = torch.linspace(offset, 0.5, 8, dtype=torch.float64)[:-1]  # 7 probabilities
z_scores = torch.cat([-torch.special.ndtri(negative), torch.zeros(1, dtype=torch.float64),
                      torch.special.ndtri(positive)]).sort().values
nf4 = (z_scores / z_scores.max()).float()
print("probabilities, positive:", [round(p, 4) for p in positive.tolist()])
print("probabilities, negative:", [round(p, 4) for p in negative.tolist()])
print("NF4 levels:      ", [round(v, 4) for v in nf4.tolist()])
print("int4 levels (÷7):", [round(k / 7, 4) for k in range(-7, 8)])

# %% [markdown]
# bitsandbytes ships the same table hard-coded (`get_4bit_type("nf4")`). When it is installed, compare:

# %%
from course_utils.quiet import import_bitsandbytes

bnb = import_bitsandbytes()  # `import bitsandbytes`, or None when it is not installed (its import is quiet)
if bnb is None:
    print("bitsandbytes is not installed here: skipped (our levels above need no library).")
else:
    table = bnb.functional.get_4bit_type("nf4", device="cpu")[:16].float()
    print("same levels as bitsandbytes' NF4 table (to 1e-6):", torch.allclose(nf4, table, atol=1e-6, rtol=0))

# %% [markdown]
# ### Other training seeds, smaller blocks
#
# The digits tables are one model from one training seed. Does the pattern hold for others, and how much of
# int3's loss do finer scales win back?
#
# 1. Set `SEED` to 1, then 2, and run the cell. Do int8 and int4 still stay close to float32, and do int3 and
#    int2 still fall?
# 2. With `SEED = 0`, set `BLOCK` to `"row"`, then `16` (a scale for every 16 weights). How much int3
#    accuracy comes back, and how many weight bytes does it cost?

# %%
SEED = 0      # try 1 and 2
BLOCK = None  # None = one scale per matrix; try "row" and 16

status(f"Training the network with training seed {SEED} …")
trained = train_digits_mlp(data, seed=SEED)
print(format_quality_table(quality_by_format(trained, data, block_size=BLOCK)))

# %% [markdown]
# <details><summary>Show a worked solution</summary>
#
# **1. Other seeds** (one scale per matrix), test accuracy:
#
# | training seed | float32 | bfloat16 | float16 | int8 | int4 | int3 | int2 |
# | --- | --- | --- | --- | --- | --- | --- | --- |
# | 0 | 98.0% | 98.0% | 98.0% | 97.8% | 97.6% | 93.1% | 32.9% |
# | 1 | 97.6% | 97.6% | 97.6% | 97.6% | 97.3% | 95.6% | 26.4% |
# | 2 | 97.1% | 97.1% | 97.1% | 97.1% | 97.3% | 88.7% | 16.4% |
#
# The pattern holds: 16-bit and int8 match float32 to within one test image, int4 stays within half a point
# (at seed 2 it even gets one more image right, by luck), int3 loses 2.0 to 8.4 points, and int2 collapses
# (16–33%). How much int3 loses depends on the seed: with one scale per matrix, the largest weight sets the
# step for all the others.
#
# **2. Finer scales** (seed 0; float32: 98.0%, loss 0.086, 18,944 weight bytes):
#
# | scales | int3 accuracy | int3 loss | int3 weight bytes | int2 accuracy |
# | --- | --- | --- | --- | --- |
# | one per matrix (`None`) | 93.1% | 0.190 | 1,784 | 32.9% |
# | one per row (`"row"`) | 96.7% | 0.122 | 2,072 | 56.0% |
# | one per 16 weights (`16`) | 97.3% | 0.092 | 2,960 | 69.1% |
#
# Smaller blocks win back most of int3's loss, and the scales cost more bytes: blocks of 16 add a 4-byte scale
# per 16 weights, 2 extra bits per weight. int2 stays far behind whatever the block size. Finer scales help
# most exactly where the levels are fewest.
#
# </details>
#
# ### bitsandbytes' NF4, value by value
#
# bitsandbytes' own NF4 is two calls: `quantize_4bit` packs two 4-bit codes into each byte and keeps one
# float32 absmax (a block's largest |weight|) per block; `dequantize_4bit` reads them back. On the
# 4096 × 4096 matrix, when bitsandbytes is installed:

# %%
status("Running bitsandbytes' NF4 on the 4096 x 4096 matrix …")
if bnb is None:
    print("bitsandbytes is not installed here: skipped (our NF4 above needs no library).")
else:
    packed, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4")
    w_bnb = bnb.functional.dequantize_4bit(packed, state)
    size = packed.numel() + state.absmax.numel() * 4  # packed codes + a float32 absmax per block
    print(f"codes: {packed.dtype}, {packed.numel():,} bytes; absmax: {state.absmax.dtype}, {state.absmax.numel():,}"
          f" blocks of {state.blocksize}; read back: {w_bnb.dtype}, {tuple(w_bnb.shape)}")
    print(f"bitsandbytes nf4, blocks of 64: {size / 1e6:.2f} MB, average error {(w - w_bnb).abs().mean():.4f}")

# %% [markdown]
# `quant.nf4_agreement` compares that read-back with our NF4 (`quant.quantize_nf4`, the same steps as the NF4
# cell of the core path), value by value:

# %%
if bnb is not None:
    agreement = quant.nf4_agreement(w, quant.quantize_nf4(w, block_size=64), w_bnb)
    print("bitsandbytes reads back the same values as ours, except at most 0.001% of them, each within 1e-6 "
          f"of a boundary between two levels: {agreement.holds(max_fraction=1e-5, max_distance=1e-6)}")

# %% tags=["nbval-ignore-output"] nbval_reason="how many values sit close enough to a boundary to tip depends on the processor."
if bnb is not None:
    print(f"values read back differently: {agreement.differing} of {agreement.total:,}; the farthest from a "
          f"level boundary is {agreement.boundary_distance:.1e} away (in units of its block's largest weight)")

# %% [markdown]
# The two agree on all but a handful of the 16.8 million values (the cell above counts them; the count can
# change from one processor to another). Each of those sits within 10⁻⁶ of a boundary between two levels: our
# levels differ from bitsandbytes' in the seventh decimal, and the last bit of a division can differ between
# processors, enough to tip a value that close to the other side. Both choices are equally good.
#
# ### How bitsandbytes stores its NF4 table
#
# bitsandbytes ran the recipe above once and ships the result: `get_4bit_type("nf4")` returns 16 hard-coded
# values. Its `create_normal_map(offset=0.9677083)` rebuilds them with scipy's `norm.ppf` (the inverse normal
# CDF, like `ndtri`) on float32 probabilities, and pads the table to 256 entries with zeros so that 8-bit
# indices work too; sorting puts the 7 negative levels first, then the zeros, then the 8 positive ones. Ours
# computes in float64 from the unrounded offset (0.96770833…), so the two tables differ by at most 2 × 10⁻⁷.
#
# bitsandbytes can also quantize the block scales themselves ("double quantization"), to save another
# 0.37 bits per weight.
