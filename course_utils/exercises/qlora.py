"""Auto-checked exercises of notebook 01b: a model's size in 4 bits, and what a LoRA adapter trains.

The expected values come from the course's own counters: :func:`course_utils.footprint.computed_sizes` (the
meta device) for the size, :func:`course_utils.architecture.lora_adapter_params` for the adapter.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from course_utils.exercises import Feedback, check_number

#: Exercise 1's model: the Unsloth example's Qwen3-4B-Instruct-2507 (a config shipped in data/configs).
SIZE_MODEL = "qwen3-4b-instruct-2507.json"
#: Exercise 2's adapter: rank 8 on the query and value projections of the notebook's SmolLM2-135M.
LORA_MODEL, LORA_RANK, LORA_TARGETS = "smollm2-135m.json", 8, ("q_proj", "v_proj")


@lru_cache(maxsize=None)
def size_facts() -> dict[str, int]:
    """Exercise 1's givens and answer, counted on the meta device: parameters, parts, 4-bit bytes, NF4 scales."""
    from course_utils.footprint import computed_sizes, footprint_parts
    from course_utils.models import meta_model

    parts = {p.name: p.params for p in footprint_parts(meta_model(SIZE_MODEL), 16) if p.name != "buffers"}
    sizes = computed_sizes(SIZE_MODEL)
    linears = sum(n for name, n in parts.items() if "linears" in name)
    return {"params": sizes.params, "embedding": parts["embedding table"], "linears": linears,
            "other_16bit": sizes.params - parts["embedding table"] - linears, "bytes4": sizes.bytes4,
            "bytes16": sizes.bytes16, "scales4": sizes.scales4}


def check_four_bit_size(answer_gb: Any) -> Feedback:
    """Exercise 1: Qwen3-4B-Instruct-2507's 4-bit size in GB, as ``get_memory_footprint()`` would count it."""
    f = size_facts()
    gb = 1e9
    mistakes = [
        (f["params"] * 0.5 / gb, "That is every parameter at 4 bits. The embedding table and the norms are not "
                                 "linear layers: they stay 16-bit, 2 bytes each."),
        (f["bytes16"] / gb, "That is the 16-bit size: 2 bytes for every parameter. In 4 bits the linear layers "
                            "take half a byte each."),
        ((f["bytes4"] + 2 * f["embedding"]) / gb, "You counted the embedding table twice. The lm_head is tied: it "
                                                  "shares the table's matrix, so it adds nothing."),
        (f["params"] * 4 / gb, "4 bits is half a byte, not 4 bytes."),
        (f["bytes4"] / 2**30, "That is the size in GiB (2^30 bytes). The course prints GB, 10^9 bytes."),
        ((f["bytes4"] + f["scales4"]) / gb, "That includes the NF4 scales (one float32 per 64 weights); "
                                            "get_memory_footprint() leaves them out, and so does this question."),
    ]
    return check_number(answer_gb, f["bytes4"] / gb, name="answer_gb", what="the 4-bit size in GB (e.g. 3.1)",
                        rel_tol=0.01, mistakes=mistakes, unit="GB",
                        hint="Linear weights: 0.5 byte each. Embedding table and norms: 2 bytes each. "
                             "Add them up and divide by 1e9.")


def lora_answer() -> int:
    """Exercise 2's answer, from the course's adapter counter."""
    from course_utils.architecture import lora_adapter_params

    return lora_adapter_params(LORA_MODEL, LORA_RANK, LORA_TARGETS)


def check_lora_count(answer: Any) -> Feedback:
    """Exercise 2: the trainable numbers of LoRA rank 8 on q_proj and v_proj of SmolLM2-135M."""
    from course_utils.architecture import Architecture

    arch = Architecture.from_config(LORA_MODEL)
    (q_in, q_out), (v_in, v_out) = (arch.projection_shapes()[t] for t in LORA_TARGETS)
    r, layers = LORA_RANK, arch.layers
    mistakes = [
        (r * 2 * (v_in + v_in) * layers, f"v_proj is not square: it maps {v_in} numbers to {v_out} "
                                         f"({arch.kv_heads} key/value heads of {arch.head_dim}). Read its shape in "
                                         "the printed decoder layer."),
        (r * (q_in + q_out + v_in + v_out), "That is one decoder layer. The adapter sits in every one of the "
                                            f"{layers} layers."),
        (2 * lora_answer(), "That is rank 16. This adapter has rank 8."),
        (r * (q_in * q_out + v_in * v_out) * layers, "A is r x d_in and B is d_out x r: r x (d_in + d_out) "
                                                     "numbers, not r x d_in x d_out."),
        (r * (q_in + v_in) * layers, "You counted only A (r x d_in). B adds d_out x r."),
        (r * sum(i + o for i, o in arch.projection_shapes().values()) * layers,
         "That is all seven projections. Here the adapter goes on q_proj and v_proj only."),
    ]
    return check_number(answer, lora_answer(), name="answer", what="a whole number of trainable parameters",
                        rel_tol=0.0, abs_tol=0.5, mistakes=mistakes,
                        hint="Per targeted layer: r x (d_in + d_out). Add q_proj and v_proj, then multiply "
                             "by the number of decoder layers.")
