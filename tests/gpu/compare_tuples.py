# The shim's REGISTER_VIDMEM tuples must equal libcuda's (suppressed) native ones, allocation by
# allocation: every tuple the shim registered is one libcuda registered for that hMemory.
import re, sys
shim_log, native_log = sys.argv[1], sys.argv[2]
pat = re.compile(r"hClient=(0x[0-9a-f]+) hMemory=(0x[0-9a-f]+) address=(0x[0-9a-f]+) size=(0x[0-9a-f]+) offset=(0x[0-9a-f]+)")
shim = set()
for l in open(shim_log, errors="replace"):
    if " registered {" in l:
        m = pat.search(l)
        if m: shim.add(tuple(int(x, 16) for x in m.groups()))
nat = set()
try:
    for l in open(native_log):
        m = re.search(r"NATIVE REGISTER_VIDMEM client=([0-9a-f]+) hMemory=([0-9a-f]+) address=([0-9a-f]+) size=([0-9a-f]+) offset=([0-9a-f]+)", l)
        if m: nat.add(tuple(int(x, 16) for x in m.groups()))
except FileNotFoundError:
    pass
missing = shim - nat
print(f"tuples shim_registered_distinct={len(shim)} native_distinct={len(nat)} shim_equal_to_native={len(shim & nat)} shim_not_native={len(missing)}")
for t in sorted(missing)[:5]:
    print("  not native:", " ".join(hex(x) for x in t))
