// The lab's hosts and faults (ours, test only): which lab host this process is, the names its
// fake HCA goes by, and the fault file. fakelab.c is compiled into the lab's provider and
// into fakesys.so alike, so both answer from the same facts.
//
// A process is lab host N when FAKEWIRE_HOST=N (0..FW_MAXHOSTS-1; unset: host 0). Host N has one
// HCA fwroce_N on PCI function 0000:NN:00.0 (NN = 0x40 + N) with net device fwnetN, MAC
// 00:11:22:33:xx:yy (xxyy = 0x4455 + N), GIDs fe80::211:22ff:fe33:xxyy (index 0 RoCE v1, 1 RoCE
// v2) and ::ffff:10.0.a.b (a.b = N + 1; index 2 RoCE v1, 3 RoCE v2), host name labhostN.
// FAKEWIRE_LAB=DIR makes the wire span processes (DIR/run holds each host's QP numbers); the
// fault file is $FAKEWIRE_FAULTS, else DIR/faults (format in tests/lab/README.md).
#ifndef FAKELAB_H
#define FAKELAB_H
#include <stdint.h>
#pragma GCC visibility push(hidden) // one copy in each library that has it

#define FW_MAXHOSTS 128
#define FW_NGIDS 4

typedef struct fw_host {
  int n;
  char dev[16], ndev[16], pci[16], name[16];
  uint8_t guid[8]; // EUI-64 of the MAC: ibv_get_device_guid's bytes in memory
  uint8_t gid[FW_NGIDS][16];
} fw_host;
extern const int fw_gid_type[FW_NGIDS]; // IBV_GID_TYPE_*: 1 RoCE v1, 2 RoCE v2

void fw_host_of(int n, fw_host *h);
const fw_host *fw_me(void); // this process's host (FAKEWIRE_HOST)
int fw_host_env(void); // FAKEWIRE_HOST was set: the process is a lab host
int fw_gid_host(const uint8_t gid[16]); // the host whose GID this is, or -1
const char *fw_lab_dir(void); // FAKEWIRE_LAB, or NULL: one process only

// Faults, read again whenever the fault file changes (every query stats it).
int fw_fault_port_down(int h); // "down H"
int fw_fault_link_down(int a, int b); // "down A-B", or either host down
double fw_fault_cap(int a, int b); // bytes per second, 0 = none ("cap H MBPS", "cap A-B MBPS")
int fw_fault_corrupt(int a, int b); // "corrupt H", "corrupt A-B"
int fw_fault_no_dmabuf(int h); // "no-dmabuf H"
int fw_fault_peermem(int h); // "peermem H" (or FAKEWIRE_PEERMEM=1 in the process)
// "gate N [MS]": the first request of each connected QP waits until N QPs of the whole lab have
// made theirs, at most MS (20 000) milliseconds (fakewire_gate.c): work that should run at once is
// proven to, by a count. 0 = no gate
int fw_fault_gate(int *ms);
#pragma GCC visibility pop
#endif
