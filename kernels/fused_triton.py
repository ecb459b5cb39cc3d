"""Fused Triton gated-delta-rule prefill kernel (issue 7; owned by the issue-7 engineer).

One program per (sequence, value head, value slice BV) walks the chunks of its sequence, keeping the
recurrent state S [dk, BV] on chip across chunks; per chunk it builds the intra-chunk matrices, solves
the triangular system (UT transform) in-kernel, writes the output and updates the state: one launch,
no intermediate tensors in HBM. A context-parallel variant lives in kernels/fused_triton_cp.py.

Work in progress: the kernel lands in the next commits.
"""
