#!/usr/bin/env python3
"""Zero every GPU binary of a CUDA library's fat binaries but those one GPU runs (ours; for the
device runs only): PyPI's libnccl.so.2 (nvidia-nccl-cu13 2.32.3) is 330 MiB, over what one call
may carry, and most of it is cubins for other architectures. Each fat binary keeps its layout
(every entry header and size as it was); the payload of an entry the GPU would never load is
zeroed, so the file compresses to a few MiB more than the code the GPU runs.
  prune-fatbin.py LIB OUT SM     (SM: 90 for an H100 or H200)
Kept: machine code (kind 2) for SM exactly, PTX (kind 1) for SM and below (the driver compiles
PTX only for its own architecture or later). The fat binary layout read here: a 16-byte
container header (magic 0xBA55ED50, version 1, header size, payload size), then entries, each a
header (kind u16, version u16, header size u32, padded payload size u32, ..., SM u32 at 28)
followed by its payload."""
import struct
import sys

MAGIC = struct.pack("<I", 0xBA55ED50)


def prune(data: bytearray, sm: int):
    kept = zeroed = 0
    at = data.find(MAGIC)
    while at >= 0:
        _, version, hsize, fsize = struct.unpack_from("<IHHQ", data, at)
        end = at + hsize + fsize
        if version != 1 or hsize != 16 or end > len(data):
            at = data.find(MAGIC, at + 4)
            continue
        p = at + hsize
        while p + 32 <= end:
            kind, _, ehs, padded = struct.unpack_from("<HHII", data, p)
            (entry_sm,) = struct.unpack_from("<I", data, p + 28)
            if ehs < 32 or p + ehs + padded > end:
                break
            keep = (kind == 2 and entry_sm == sm) or (kind == 1 and entry_sm <= sm)
            if keep:
                kept += padded
            else:
                data[p + ehs : p + ehs + padded] = bytes(padded)
                zeroed += padded
            p += ehs + padded
        at = data.find(MAGIC, end)
    return kept, zeroed


def main():
    lib, out, sm = sys.argv[1], sys.argv[2], int(sys.argv[3])
    data = bytearray(open(lib, "rb").read())
    kept, zeroed = prune(data, sm)
    open(out, "wb").write(data)
    print(f"prune-fatbin: sm_{sm}: kept {kept} bytes of GPU code, zeroed {zeroed}")


if __name__ == "__main__":
    main()
