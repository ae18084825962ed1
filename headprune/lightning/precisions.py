"""The arithmetic a recovery fine-tune may run in (Lightning's precision names), without importing Lightning."""

PRECISIONS = ("32-true", "bf16-mixed")  # fp32; or weights, gradients and AdamW in fp32 with matmuls in bfloat16 under autocast
