#!/usr/bin/env bash
# How h200-variants4/ was made (kept as the record; the builds were carried as bench-variants/*.so
# and are not in the repository). Each variant in its own process, the order of the variants
# rotated per round, 4 rounds (each variant once in each position); in each process `bench alloc-ab SIZE 200 40`: 40 pairs of
# 200-iteration batches, the shim working in one and paused (gdrshim_bench_pause) in the other.
#   base        = 8fd0257 (end of the previous session: full batches applied by the thread that
#                 fills them)
#   spin        = the final build (819de74): full batches applied on the helper thread (looks every millisecond); the
#                 queue's lock and hot fields in one cache line, released with a plain store
#   spin-inline = the same build with GDRSHIM_APPLY_THREAD=0 (same code and layout, no thread)
#   demote      = spin + the helper pushes the applied batch's lines to the shared cache
#                 (CLDEMOTE, a NOP where unsupported) before the hooks write them again
# Through the shared tests/gpu/run-h200-variants.sh.
exec tests/gpu/run-h200-variants.sh "${1:?out}" 4 base spin spin-inline:spin:GDRSHIM_APPLY_THREAD=0 demote
