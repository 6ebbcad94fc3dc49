// Test-only (ours): GeForce emulation on an H200. Preloaded *before* libgdrshim.so, it keeps
// libcuda's own NV50_THIRD_PARTY_P2P traffic from reaching the kernel (fake success, a fake
// handle, token 0xFE00) and logs the REGISTER_VIDMEM tuples libcuda would have made, so the real
// RM sees only gdrshim's 503C calls (gdrshim issues its own through the real ioctl, after us).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t fake[64]; static int nfake;
static FILE *logf_;
static int is_fake(uint32_t h) { for (int i = 0; i < nfake; i++) if (fake[i] == h) return 1; return 0; }
static void lg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void lg(const char *fmt, ...) {
  if (!logf_) { const char *p = getenv("SUPPRESS_LOG"); logf_ = p ? fopen(p, "a") : stderr; if (!logf_) logf_ = stderr; setvbuf(logf_, NULL, _IOLBF, 0); }
  va_list ap; va_start(ap, fmt); vfprintf(logf_, fmt, ap); va_end(ap);
}
int ioctl(int fd, unsigned long req, void *arg) {
  static int (*next)(int, unsigned long, void *);
  if (!next) next = (int (*)(int, unsigned long, void *))dlsym(RTLD_NEXT, "ioctl");
  uint32_t *w = arg;
  if (arg && (req & 0xff) == 0x2b && ((req >> 8) & 0xff) == 0x46 && w[3] == 0x503c) {
    int big = ((req >> 16) & 0x3fff) == 48;
    if (!w[2]) w[2] = 0x5c0ffe00 + nfake;
    if (nfake < 64) fake[nfake++] = w[2];
    w[big ? 10 : 7] = 0;
    lg("SUPPRESSED alloc 503c client=%08x parent=%08x h=%08x\n", w[0], w[1], w[2]);
    return 0;
  }
  if (arg && (req & 0xff) == 0x2a && ((req >> 16) & 0x3fff) == 32 && is_fake(w[1])) {
    uint32_t cmd = w[2]; uint8_t *p = (uint8_t *)(uintptr_t)(*(uint64_t *)(w + 4));
    if (cmd == 0x503c0102 && p) *(uint64_t *)(p + 8) = 0xfe00;
    if (cmd == 0x503c0104 && p) lg("NATIVE REGISTER_VIDMEM client=%08x hMemory=%08x address=%lx size=%lx offset=%lx\n", w[0], *(uint32_t *)p, *(uint64_t *)(p + 8), *(uint64_t *)(p + 16), *(uint64_t *)(p + 24));
    if (cmd == 0x503c0105 && p) lg("NATIVE UNREGISTER_VIDMEM client=%08x hMemory=%08x\n", w[0], *(uint32_t *)p);
    w[7] = 0;
    return 0;
  }
  if (arg && (req & 0xff) == 0x29 && ((req >> 16) & 0x3fff) == 16 && is_fake(w[2])) { w[3] = 0; return 0; }
  return next(fd, req, arg);
}
