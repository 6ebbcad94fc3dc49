#!/usr/bin/env bash
# How h200-variants/ and h200-variants2/ were made (kept as the record; the builds were carried
# as bench-variants/*.so and are not in the repository). Each build in its own process, the order
# of the builds rotated per round, 6 rounds; in each process `bench alloc-ab SIZE 200 40`: 40 pairs
# of 200-iteration batches, the shim working in one and paused (gdrshim_bench_pause) in the other.
#   h200-variants:  A = ee3ee96 (start of the session) + a minimal gdrshim_bench_pause;
#                   B = 40b0f9c + the counters/ranges changes of e074d53 (backlog of 128);
#                   C = B with a backlog of 1 (every event applied at once)
#   h200-variants2: B again; F = e074d53 (B + inline GPU list, one-descent unmaps, backlog applied
#                   by reference); G = F with a backlog of 512 (= 2060463); H = F with the hot
#                   functions in one link section (not kept: no gain)
# Now through the shared tests/gpu/run-h200-variants.sh (same loops and analysis; it also writes
# cpu.txt and variants-summaries.txt, and sets GDRSHIM_APPLY_THREAD, which these builds ignore).
exec tests/gpu/run-h200-variants.sh "${1:?out}" 6 B-backlog128 F-v3 G-v3-backlog512 H-v3-hot
