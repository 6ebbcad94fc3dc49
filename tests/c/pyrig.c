// The fake machine for a Python program (ours): loaded with ctypes, it sets the driver and
// libibverbs up as rig.h does and registers the program's GPU memory.
#include "rig.h"

int pyrig_setup(void) { setup(); return 0; }
void *pyrig_reg(void) { gpu_alloc(0, BASE, 64 * K64); return must_reg(vreg, BASE, 64 * K64, "an MR"); }
int pyrig_dereg(void *m) { return vdereg((struct ibv_mr *)m); }
int pyrig_miss(void) { must_miss(BASE + 60 * K64, 8 * K64, 0xf, "an MR past the allocation"); return failures; }
