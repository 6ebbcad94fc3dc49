#!/usr/bin/env bash
# How h200-variants3/ was made (kept as the record; the builds were carried as bench-variants/*.so
# and are not in the repository). Each variant in its own process, the order of the variants
# rotated per round, 6 rounds; in each process `bench alloc-ab SIZE 200 40`: 40 pairs of
# 200-iteration batches, the shim working in one and paused (gdrshim_bench_pause) in the other.
#   base        = 8fd0257 (end of the previous session: full batches applied by the thread that
#                 fills them)
#   poll        = full batches applied on a helper thread that looks every millisecond
#                 (GDRSHIM_APPLY_THREAD=1, the default)
#   poll-inline = the same build with GDRSHIM_APPLY_THREAD=0 (same code and layout, no thread)
#   unpark      = helper thread woken by the hook for every batch (HELPER_POLLS = 0)
# Now through the shared tests/gpu/run-h200-variants.sh (same loops and analysis;
# it also writes cpu.txt).
exec tests/gpu/run-h200-variants.sh "${1:?out}" 6 base poll poll-inline:poll:GDRSHIM_APPLY_THREAD=0 unpark
