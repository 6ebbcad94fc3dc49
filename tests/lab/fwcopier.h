// The wire's copier (ours, test only): what the wire (fakewire_copier.c) and its copier process
// (fwcopier.c) say to each other over their socketpair, one SOCK_SEQPACKET message each way per
// request. The copier does a lab process's GPU copies in a CUDA context of its own, so that they
// finish while a thread of the program is blocked in libcuda (tests/lab/README.md, "The wire").
#pragma once
#include <stdint.h>

#define FWC_STAGING (8u << 20) // the shared staging area (a memfd both map), bytes
#define FWC_SOCK_FD 3          // the copier's end of the socketpair, in the copier
#define FWC_STAGING_FD 4       // the staging memfd, in the copier

enum fwc_op {
  FWC_IMPORT_IPC = 1, // ipc: a CUipcMemHandle of the allocation at base
  FWC_IMPORT_FD,      // an fd of cuMemExportToShareableHandle (POSIX_FD) rides with the message
  FWC_H2G,            // staging[0..n) -> program address dst
  FWC_G2H,            // program address src -> staging[0..n)
  FWC_G2G,            // program address src -> program address dst
};
typedef struct {
  uint32_t op;
  int32_t device;     // CUDA ordinal of the allocation (imports)
  uint64_t base, size; // the allocation in the program (imports)
  uint64_t dst, src, n; // program addresses (copies)
  uint8_t ipc[64];    // CUipcMemHandle
} fwc_req;
typedef struct {
  int32_t rc; // 0, or the CUresult (or -1: no import holds the address)
} fwc_rsp;
