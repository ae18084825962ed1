"""llama.cpp's float16 GELU table as the GELU families' client checks model it (clients/ggml_gelu.py)."""

from __future__ import annotations

import math

import torch

from clients.ggml_gelu import ggml_gelu, llama_cpp_gelu


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


def test_table_values_are_float16_within_one_step_of_the_tanh_gelu():
    x = torch.linspace(-12, 12, 20001, dtype=torch.float64).float()
    y = ggml_gelu(x)
    inside = x.abs() < 10
    assert torch.equal(y[inside], y[inside].half().float())  # read from a float16 table
    assert torch.equal(y[x >= 10], x[x >= 10]) and torch.equal(y[x <= -10], torch.zeros_like(y[x <= -10]))
    # input rounded to float16 (half a step of x, slope at most 1.13), output rounded (half a step of the value)
    bound = 2.0**-11 * (1.13 * x.abs() + tanh_gelu(x).abs()) + 2.0**-24
    assert ((y - tanh_gelu(x)).abs() <= bound).all()
    assert (y - tanh_gelu(x)).abs().max() > 0  # not the exact function


def test_llama_cpp_gelu_moves_a_model_within_the_table_and_restores_it():
    from clients.cases import tiny_family

    model, tokenizer = tiny_family("gemma2")
    ids = tokenizer("the cat sat on the red mat", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        exact = model(input_ids=ids).logits
        with llama_cpp_gelu(model):
            table = model(input_ids=ids).logits
        again = model(input_ids=ids).logits
    assert torch.equal(exact, again)
    assert 0 < (table - exact).abs().max() < 1e-2 * exact.abs().max()
