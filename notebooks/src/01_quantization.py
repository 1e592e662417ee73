# %% [markdown]
# # Quantization: keep fewer digits
#
# Your GPU's memory is a backpack, and the model's weights are the heaviest books in it. Quantization swaps
# hardcovers for paperbacks: every weight is stored with fewer bits, at a small cost in accuracy.
#
# **What you will be able to do**
# - explain scale, zero-point, read-back and quantization error, and quantize numbers by hand;
# - compute what a quantized tensor really takes, including its scales and zero-points;
# - measure what float32 → 16-bit → 8 → 4 → 3 → 2 bits does to a real trained network;
# - choose between one scale per tensor, one scale per block of 64, a zero-point, and NF4.
#
# Everything here runs on a laptop CPU; no GPU needed.

# %% [setup]

# %% [markdown]
# ## Why quantize?
#
# A model's weights are numbers, and numbers take bytes. In float32 each weight takes 4 bytes (32 bits).
# Writing π as 3.14 instead of 3.14159265 keeps what matters and drops the rest; quantization does the same
# with weights: fewer bits per number, a little less precision. Here is what a 7-billion-parameter model's
# weights take at each width:

# %%
params = 7_000_000_000
for name, bits in [("float32", 32), ("bfloat16", 16), ("int8", 8), ("int4", 4)]:
    print(f"{name:<9} {bits:>2} bits per weight: {params * bits / 8 / 1e9:5.1f} GB")

# %% [markdown]
# From 28 GB to 3.5 GB: a model that needed a data-centre GPU now fits on a laptop GPU. Smaller weights also
# make text generation faster, because each new token has to read every weight from memory once.
#
# ## How it works
#
# Pick a small set of **evenly spaced levels** and snap every number to the nearest one.
#
# - The **scale** $s$ is the gap between two levels.
# - The **zero-point** $z$ shifts the levels when the numbers are not centred on zero.
# - Quantize: $q = \mathrm{round}(x / s) + z$, a small integer that is what we store.
# - Read back (dequantize): $\hat{x} = s \cdot (q - z)$. The gap $\hat{x} - x$ is the **quantization error**.

# %% [markdown]
# With $b$ bits and no zero-point (**symmetric**), the levels are $-(2^{b-1}-1) \dots 2^{b-1}-1$: −127…127 for
# int8, −7…7 for int4. The scale is $s = \max|x| / q_{max}$, so the number furthest from zero lands exactly
# on the outermost level. Every other number lands at most half a step, $s/2$, from where it started.
#
# `course_utils.quant.quantize` does exactly this. Four numbers, 8 bits: the largest is 1.27, so
# $s = 1.27 / 127 = 0.01$.

# %%
import torch
from course_utils import quant

x = torch.tensor([0.5, -1.27, 0.02, 1.0])
q = quant.quantize(x, bits=8)
print("scale s:   ", round(q.scales.item(), 6))
print("stored q:  ", q.codes.tolist())
print("read back: ", [round(v, 6) for v in quant.dequantize(q).tolist()])

# %% [markdown]
# Every number here is a whole multiple of 0.01, so nothing is lost. Real weights are not that tidy.
#
# **When does the zero-point help?** When the numbers are lopsided, like values from −0.2 to 2.35. Symmetric
# levels span −2.35…2.35, and those below −0.2 are never used. With a zero-point (**asymmetric**), the 256 levels 0…255 span exactly −0.2…2.35:
# $s = 2.55 / 255 = 0.01$ and $z = 20$, so the stored integer 20 means 0.

# %%
x = torch.tensor([-0.2, 0.0, 0.3, 1.0, 2.35])
for symmetric in (True, False):
    q = quant.quantize(x, bits=8, symmetric=symmetric)
    zero_point = None if q.zero_points is None else q.zero_points.item()
    print(f"symmetric={symmetric!s:<5}  s={q.scales.item():.5f}  z={zero_point}  q={q.codes.tolist()}"
          f"  average error {quant.mean_abs_error(x, q):.5f}")

# %% [markdown]
# The asymmetric version reads every value back exactly; the symmetric one is off by about 0.002 on average,
# because its step is nearly twice as big. The price of a zero-point is one more small integer to store per
# scale.
#
# ## Quantize eight numbers
#
# Now by hand, with 4 bits. Take 8 made-up weights. The one furthest from zero is −0.35. Four bits have 16
# possible values; like the symmetric scheme above, this example uses the whole steps from −7 to 7. So one
# step is 0.35 ÷ 7 = 0.05, and each weight becomes its nearest step.
#
# **Predict before you run**: which weights will be read back exactly? How far can any weight move?

# %%
table = quant.eight_numbers(bits=4)
print(quant.format_eight_numbers(table))
print(f"\nstep {table.step:.2f}, half a step {table.step / 2:.3f}, "
      f"largest error {max(abs(e) for e in table.errors):.2f}")

# %% [markdown]
# Two weights, −0.05 and −0.35, were already multiples of the step and come back exactly. Every other weight
# moves by 0.01 or 0.02, never more than half a step (0.025). What did we save? The 8 weights took 32 bytes in
# float32. In 4 bits the steps take 4 bytes, **plus 4 bytes for the step size**, which we need to read them
# back:

# %%
q = quant.quantize(torch.tensor(quant.EIGHT_WEIGHTS), bits=4)
parts = quant.storage(q)
print(f"float32: 8 x 4 bytes = {8 * 4} bytes")
print(f"4-bit:   {parts.codes} bytes of steps + {parts.scales} bytes for the step size = {parts.total} bytes")

# %% [markdown]
# With only 8 weights, the scale costs as much as the weights. That is why real formats share one scale
# among many weights, but not too many (more on that below). The chart shows each weight moving to its level:

# %%
from course_utils.plots.quant import plot_eight_numbers

_ = plot_eight_numbers(bits=4)

# %% [markdown] slide="notes"
# **Text description of the chart.** Two rows of 8 dots on an axis from −0.4 to 0.4. The float32 row has the
# original weights: −0.35, −0.22, −0.05, 0.02, 0.07, 0.12, 0.18 and 0.31. The 4-bit row has the rounded
# values: −0.35, −0.20, −0.05, 0, 0.05, 0.10, 0.20 and 0.30. Every rounded value is a multiple of 0.05, and
# each dot is at most 0.02 from its original. Faint vertical lines mark the levels; a grey segment joins each
# weight to its read-back.

# %% [markdown]
# **Try it live**: move the slider from 2 to 8 bits. At 2 bits only three levels are left (−0.35, 0, 0.35)
# and most weights collapse onto them; at 8 bits the dots barely move. The text under the table describes the
# chart for each setting.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget; nbval has no widget front end to compare it with.
from course_utils.widgets.quant import eight_numbers_widget

eight_numbers_widget()

# %% [markdown]
# ### Your turn: int8 by hand
#
# Write `quantize_int8(x)` in plain torch: symmetric int8 with one scale for the whole tensor, as above
# ($s = \max|x| / 127$, $q = \mathrm{round}(x / s)$). Return the codes (a tensor of the shape of `x`) and the
# scale. The check compares your function with `quant.quantize(x, 8)` on four tensors, one of them with its
# largest value on the negative side.

# %%
from course_utils.exercises.quantization import check_int4_block_bytes, check_quantize_int8


def quantize_int8(x):
    """Symmetric int8 with one scale: return (codes, scale)."""
    raise NotImplementedError  # your code: s = ..., q = ..., return q, s


check_quantize_int8(quantize_int8)

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
# Typical slips: dividing by 128 (the symmetric levels stop at ±127), `x.max()` instead of `x.abs().max()`
# (the extreme can be negative), and `.int()`, which cuts the fraction off instead of rounding.
#
# </details>
#
# ## Benefits and trade-offs
#
# **Benefits**
# - 4-bit weights need about a quarter of the memory of 16-bit ones, plus a little for the scales.
# - Faster text generation: each new token reads every weight from memory, and fewer bytes means less waiting
#   (a later module measures this).
# - Bigger models fit on smaller, cheaper GPUs.

# %% [markdown]
# **Trade-offs**
# - Some quality loss: 8 bits are close to lossless, 4 bits lose a little, 3 and 2 bits lose a lot (measured
#   in the next section).
# - Small models suffer more than big ones: they have fewer redundant weights to absorb the rounding.
# - Not always faster: weights are turned back into 16-bit numbers before the maths, and that costs time.
# - You cannot train quantized weights directly: a gradient step is far smaller than a 4-bit level. QLoRA
#   freezes a 4-bit model and trains small 16-bit adapters next to it (see the next notebook).
#
# ## Same model, four formats
#
# Claims are cheap; let's measure. We train a small network (64 pixels → 64 hidden units → 10 digits) on
# scikit-learn's handwritten digits (they ship inside the package). Then we store its weights in float32,
# 16-bit, int8, int4, int3 and int2, and measure accuracy on 450 test images the network never saw, and the
# test loss (cross-entropy), which moves even when accuracy does not.

# %% [markdown] slide="notes"
# The int formats use `quant.quantize` exactly as above: symmetric, **one scale per weight matrix**. The
# model then computes in float32 with the read-back weights ("fake quantization"): it shows the quality a
# format gives, not its speed. Biases stay in float32, as in real schemes.

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
# **Predict before you run**: how many accuracy points will int8 lose? int4? int2, with only three levels
# (−1, 0, 1) per matrix?

# %%
per_tensor = quality_by_format(model, data)
print(format_quality_table(per_tensor))

# %% [markdown]
# 16-bit and int8 are lossless in practice (int8 misses one more test image). int4 loses 0.4 points, and the
# loss rises from 0.086 to 0.090. int3 loses a lot (93.1%, the loss more than doubles), and int2 wrecks the
# model (32.9%). "Weight bytes" counts the two weight matrices, with their scales.
#
# One scale per matrix is the crudest choice. What if each output row of a matrix gets its own scale (64 and
# 10 scales here instead of 1)?

# %%
per_row = quality_by_format(model, data, block_size="row")
print(format_quality_table(per_row))

# %%
from course_utils.plots.quant import plot_quality_vs_bits

_ = plot_quality_vs_bits({"one scale per tensor": per_tensor, "one scale per row": per_row})

# %% [markdown] slide="notes"
# **Text description of the chart.** Two line charts with the weight formats float32, bfloat16, float16, int8,
# int4, int3 and int2 on the horizontal axis, and one line for each way of choosing scales. Left, test
# accuracy: with one scale per tensor 98.0%, 98.0%, 98.0%, 97.8%, 97.6%, 93.1% and 32.9%; with one scale per
# row 98.0%, 98.0%, 98.0%, 98.0%, 97.6%, 96.7% and 56.0%. Right, test loss on a log scale: per tensor 0.086,
# 0.087, 0.086, 0.087, 0.090, 0.190 and 2.331; per row 0.086, 0.087, 0.086, 0.086, 0.090, 0.122 and 1.310.
# Both lines stay flat down to int4, then fall; the per-row line falls less at int3 and int2.

# %% [markdown]
# Finer scales rescue much of int3 (96.7% instead of 93.1%) for a few hundred bytes of scales, and int2 still
# fails either way. That is the idea behind real 4-bit formats, next. These are the numbers of one small
# model and one training seed; the optional part at the end tries other seeds.
#
# ### Try it: any format, any scales
#
# `format_view` puts one setting next to float32: here int4 with one scale per row (the table's int4 row).

# %%
from course_utils.widgets.quant import format_view, format_widget

text, _ = format_view("int4", "row", model, data)
print(text)

# %% [markdown]
# **Try it live**: pick a format and, for the int formats, how many weights share a scale. Try int3 with one
# scale per tensor, per row, then per 16 weights: accuracy comes back as the scales take more bytes. A row
# here holds 64 weights, so "one per row" and "one per 64 weights" give the same network.

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget; nbval has no widget front end to compare it with.
format_widget(model, data)

# %% [markdown]
# ## In practice: a 4096 × 4096 weight matrix
#
# A large language model is mostly matrices like this one: 16.8 million weights. We fill it with random
# normal numbers (trained weights look roughly like that) and quantize it with one scale to 8 and 4 bits.
#
# **Predict before you run**: int4 has 15 levels, int8 has 255. Will int4's average error be about 2× or
# about 17× that of int8?

# %%
_ = torch.manual_seed(0)
w = torch.randn(4096, 4096)  # a weight matrix in float32
print(f"float32: {w.nbytes / 1e6:.0f} MB")
for bits in (8, 4):
    q = quant.quantize(w, bits)  # one scale for the whole matrix
    print(f"int{bits}:    {quant.storage_bytes(q) / 1e6:.0f} MB, average error {quant.mean_abs_error(w, q):.3f}")

# %% [markdown]
# About 18×: each bit fewer doubles the step, and four bits fewer make it 127 / 7 ≈ 18 times bigger. The sizes
# include the one 4-byte scale. Why is int4 with one scale so crude? Among 16.8 million normal numbers, the
# largest is above 5, so the step is above 0.7, while most weights lie between −1 and 1:

# %%
q4 = quant.quantize(w, 4)
print(f"largest |weight| {w.abs().max():.2f}, so the step is {q4.scales.item():.3f}")
print(f"weights stored as -1, 0 or +1: {(q4.codes.abs() <= 1).float().mean():.1%}")

# %% [markdown]
# Three levels carry three quarters of the weights: a few rare outliers set the step for everyone. The fix
# real 4-bit formats use: **give each block of 64 consecutive weights its own scale.** The largest of 64
# normal numbers is usually around 2.6, not 5.3, so a block's step is about half as big.
#
# ### Your turn: count the bytes
#
# One MLP matrix of a 7-billion-parameter model is 11008 × 4096. Stored in int4 with one float32 scale per
# block of 64 weights, how many bytes does it take? Write a number (an expression such as `2 * 3 + 4` is fine).

# %%
answer_bytes = ...  # bytes of the codes + bytes of the scales

check_int4_block_bytes(answer_bytes)

# %% [markdown]
# <details><summary>Worked solution</summary>
#
# 11008 × 4096 = 45,088,768 weights. Codes: 45,088,768 × 4 bits / 8 = 22,544,384 bytes. Scales:
# 45,088,768 / 64 = 704,512 blocks × 4 bytes = 2,818,048 bytes. Total **25,362,432 bytes** (25.4 MB), or
# 4.5 bits per weight: 4 for the code and 32 / 64 = 0.5 for its share of a scale. In float32 the matrix
# takes 180 MB.
#
# </details>
#
# Here is the full comparison on our 4096 × 4096 matrix, with sizes that include every scale and zero-point
# (MB = 10⁶ bytes):

# %%
status("Quantizing 16.8 million weights 8 ways (4 schemes x 2 widths) …")
rows = quant.compare_schemes(w, bits_list=(4, 8))
print(quant.format_scheme_table(rows, float32_bytes=w.nbytes))

# %% [markdown]
# - **Blocks of 64** halve the int4 error (0.189 → 0.091) for 12.5% more memory (4.5 bits per weight instead
#   of 4). At 8 bits they halve it too, from an error that was already small.
# - A **zero-point** helps a little on these centred numbers (16 levels instead of 15, spread from the
#   smallest to the largest value instead of ±the largest), and a lot on lopsided data, as we saw above.
# - The overhead is what you pay for flexibility: one float32 scale per 64 weights is 1.05 MB here; a
#   zero-point per block adds 0.13 MB at 4 bits and 0.26 MB at 8 bits.
#
# The histograms show int4 with one scale: the bell curve of float32 values collapses onto spikes.

# %%
from course_utils.plots.quant import plot_value_histograms

_ = plot_value_histograms(w, quant.round_trip(w, 4), label="int4, one scale")

# %% [markdown] slide="notes"
# **Text description of the chart.** Two histograms of 200,000 of the matrix's values (every 83rd one).
# Left: the float32 values form a bell curve centred on 0, from about −4.7 to 5.3; their int4 read-backs
# pile up on spikes 0.757 apart, the tallest at 0, then ±0.757 and ±1.51, shrinking quickly outwards.
# Right: the errors are spread evenly between −0.378 and +0.378, half a step either way.

# %% [markdown]
# **Try it live**: the widget quantizes a 1024 × 1024 random matrix (1 million values) and shows the average
# and largest error, the size split into codes, scales and zero-points, and the histograms. Try 4 bits with
# one scale, then blocks of 64, then untick "symmetric".

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: an interactive widget; nbval has no widget front end to compare it with.
from course_utils.widgets.quant import error_widget

error_widget()

# %% [markdown]
# ### NF4: put the levels where the weights are
#
# Evenly spaced levels waste resolution: trained weights are roughly normal, dense near 0 and rare in the
# tails. **NF4** ("4-bit NormalFloat", the format of QLoRA, a method to fine-tune 4-bit models) keeps 16
# levels but places them at **quantiles of the normal distribution**, so each level covers about the same
# share of the weights.

# %% [markdown]
# How the 16 levels are made (`quant.nf4_levels`; the same recipe as `create_normal_map` in bitsandbytes, the
# library behind 4-bit loading in Hugging Face Transformers):
#
# 1. Probabilities. Positive side: 9 evenly spaced values from 0.9677 down to 0.5, minus the last one (0.5
#    itself): 8. Negative side: 8 evenly spaced values over the same range, minus 0.5: 7. (0.9677 is the
#    average of 1 − 1/30 and 1 − 1/32; it keeps the outermost level finite.)
# 2. Turn each probability into a z-score with the inverse normal CDF (`torch.special.ndtri`): 0.9677 gives
#    about 1.85. The negative side gets a minus sign.
# 3. Add one exact 0 (the z-score of the dropped 0.5), sort, and divide by the largest so the levels span −1…1.
#
# 8 + 7 + 1 = 16: an even number of levels cannot be symmetric *and* contain 0, so NF4 has one more positive
# level than negative ones.

# %%
positive, negative = quant.nf4_probabilities()
print("probabilities, positive side:", [round(p, 4) for p in positive.tolist()])
print("probabilities, negative side:", [round(p, 4) for p in negative.tolist()])
levels = quant.nf4_levels()
print("NF4 levels:      ", [round(v, 4) for v in levels.tolist()])
print("int4 levels (÷7):", [round(k / 7, 4) for k in range(-7, 8)])
bnb_levels = quant.bnb_nf4_levels()  # bitsandbytes.functional.get_4bit_type("nf4"), when installed
if bnb_levels is None:
    print("bitsandbytes is not installed here: skipped the comparison with its NF4 table.")
else:
    print("same as bitsandbytes' NF4 table (to 1e-6):", torch.allclose(levels, bnb_levels, atol=1e-6, rtol=0))

# %% [markdown]
# Each block of 64 weights is divided by its largest |weight| (its "absmax", the block's scale) and every
# weight snaps to the nearest level. NF4 against int4, both with one scale per block of 64, on the same matrix:

# %%
int4_64 = quant.quantize(w, 4, block_size=64)
nf4_64 = quant.quantize_nf4(w, block_size=64)
for q in (int4_64, nf4_64):
    print(f"{q.name:<22} average error {quant.mean_abs_error(w, q):.4f}, {quant.storage_bytes(q) / 1e6:.2f} MB")

# %% [markdown]
# Same size, 20% less error: NF4's levels sit where the weights are. (The optional part at the end runs
# bitsandbytes' own NF4 on this matrix and compares it with ours value by value.)
#
# ## Real models in 4 bits, and QLoRA
#
# > **Continued in the next notebook, [Real models in 4 bits, and QLoRA](01b_real_models_qlora.ipynb).**
# > It loads Qwen2.5-1.5B-Instruct in 16 bits and in 4 bits (NF4 with bitsandbytes) and compares their memory:
# > the 4-bit model is about a third of the 16-bit size, not a quarter, because the embedding table stays in
# > 16 bits. Then it fine-tunes with QLoRA: a frozen 4-bit model plus small trainable 16-bit adapters.

# %% [markdown] slide="notes"
# **Libraries you will meet**: bitsandbytes with Hugging Face Transformers (load any model in 8 or 4 bits),
# Unsloth (fine-tune in 4 bits with QLoRA), torchao (PyTorch's own quantization), llm-compressor and
# GPTQModel (make GPTQ or AWQ checkpoints), and vLLM, TensorRT-LLM, llama.cpp and Ollama (serve quantized
# models).

# %% [markdown]
# ## Knowledge check
#
# 1. Why does int4 with one scale per matrix have such a large error (0.189) on the random matrix, and why do
#    blocks of 64 help?
# 2. A layer's outputs all lie between 0 and 6. Would you quantize them with a zero-point? Why?
# 3. NF4 has 16 levels. Why are 8 of them positive and only 7 negative?
#
# <details><summary>Show the answer</summary>
#
# 1. The single largest weight (5.30) sets the step, 0.757, while most weights lie between −1 and 1: three
#    quarters of them end up on just three levels. A block of 64 has a much smaller largest value (usually
#    around 2.6), so its step is smaller. One outlier only coarsens its own block.
# 2. Yes. Symmetric levels would span −6…6 and waste the negative half; with a zero-point all 2^b levels span
#    0…6, so the step is half as big and so is the error. The cost is one small integer per scale.
# 3. One level is an exact 0, so zeros are stored exactly. That leaves 15 levels, which cannot be
#    split evenly: NF4 gives the extra one to the positive side.
#
# </details>
#
# ## Recap
#
# - Quantization stores $q = \mathrm{round}(x/s) + z$ and reads back $\hat{x} = s(q - z)$; each value moves at
#   most half a step. The eight weights at 4 bits: step 0.05, errors of at most 0.02, 32 bytes → 4 + 4.
# - A 4096 × 4096 float32 matrix: 67 MB; int8 17 MB with average error 0.010; int4 8 MB with error 0.189 using
#   one scale. Blocks of 64 halve the int4 error for 0.5 extra bits per weight; NF4 cuts it by another 20%.
# - Count the overhead: scales and zero-points are part of the size.
# - On a real trained network: 16-bit and int8 are lossless in practice, int4 loses a little, int3 and int2
#   lose a lot; finer scales soften the fall.
# - Next: real language models in 4 bits, and training on top of them with QLoRA.

# %% [markdown]
# ## Going deeper (optional)
#
# Three extras: the digits experiment with other training seeds and smaller blocks, bitsandbytes' NF4
# compared with ours value by value, and how bitsandbytes stores its NF4 table.
#
# ### Other training seeds, smaller blocks
#
# The tables above are one model from one training seed. Does the pattern hold for other seeds, and how much
# of int3's loss do finer scales win back?
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
# float32 absmax per block; `dequantize_4bit` reads them back. Here they are on the 4096 × 4096 matrix, when
# bitsandbytes is installed (without it the cells say so, and our from-scratch NF4 stands alone):

# %%
from course_utils.hardware import import_bitsandbytes

bnb = import_bitsandbytes()  # `import bitsandbytes`, or None when it is not installed (its import is quiet)
if bnb is None:
    print("bitsandbytes is not installed here: skipped its NF4 (our own version above needs no library).")
else:
    packed, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4")
    w_hat = bnb.functional.dequantize_4bit(packed, state)
    print(f"codes: {packed.dtype}, {packed.numel():,} bytes; absmax: {state.absmax.dtype}, {state.absmax.numel():,}"
          f" blocks of {state.blocksize}; read back: {w_hat.dtype}, {tuple(w_hat.shape)}")

# %% [markdown]
# `quant.bnb_nf4_round_trip` wraps those two calls (and counts the bytes); `quant.nf4_agreement` compares its
# read-back with ours, value by value:

# %%
status("Running bitsandbytes' NF4 on the 4096 x 4096 matrix and comparing it with ours …")
bnb_nf4 = quant.bnb_nf4_round_trip(w, block_size=64)
if bnb_nf4 is None:
    print("bitsandbytes is not installed here: nothing to compare.")
else:
    print("the helper reads back exactly what the two calls above gave:", torch.equal(bnb_nf4.x_hat, w_hat))
    agreement = quant.nf4_agreement(w, nf4_64, bnb_nf4.x_hat)
    print(f"{'bitsandbytes nf4, 64':<22} average error {quant.mean_abs_error(w, bnb_nf4.x_hat):.4f}, "
          f"{bnb_nf4.size_bytes / 1e6:.2f} MB")
    print("bitsandbytes reads back the same values as ours, except at most 0.001% of them, each within 1e-6 "
          f"of a boundary between two levels: {agreement.holds(max_fraction=1e-5, max_distance=1e-6)}")

# %% tags=["nbval-ignore-output"]
# nbval-ignore-output: how many values sit close enough to a boundary to tip depends on the processor.
if bnb_nf4 is not None:
    print(f"values read back differently: {agreement.differing} of {agreement.total:,}; the farthest from a "
          f"level boundary is {agreement.boundary_distance:.1e} away (in units of its block's largest weight)")

# %% [markdown]
# Our version and bitsandbytes agree on all but a handful of the 16.8 million values (the cell above counts
# them; the count can change from one processor to another). Each of those sits within 10⁻⁶ of the boundary
# between two levels: our levels differ from bitsandbytes' in the seventh decimal, and the last bit of a
# division can differ between processors, which is enough to tip a value that close to a boundary to the
# other side. Both choices are equally good.

# %% [markdown]
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
