/* A stand-in libcuda.so.1 for dmabuf-probe's tests: the ten driver API calls the probe makes,
 * answering as the machine named by FAKE_CUDA is expected to:
 *   nodevice  cuInit -> CUDA_ERROR_NO_DEVICE (100), as libcuda does without a GPU
 *   geforce   DMA_BUF_SUPPORTED = 0 and cuMemGetHandleForAddressRange -> 801, as on a GeForce
 *   oomgpu    cuMemAlloc -> CUDA_ERROR_OUT_OF_MEMORY (2)
 *   ok        everything works; the "dma-buf" is an fd of /dev/null
 * FAKE_CUDA_ATTRS=75=12,76=0,118=0 (gpu-facts' tests): one GPU answering these attributes, any
 * other with CUDA_ERROR_INVALID_VALUE (1).
 * Built by tools/tests/dmabuf_probe.rs and gpu_facts.rs with cc -shared. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

static int mode(const char *m) {
  const char *v = getenv("FAKE_CUDA");
  return v && strcmp(v, m) == 0;
}
int cuGetErrorName(int r, const char **s) {
  *s = r == 100 ? "CUDA_ERROR_NO_DEVICE" : r == 101 ? "CUDA_ERROR_INVALID_DEVICE" : r == 801 ? "CUDA_ERROR_NOT_SUPPORTED"
     : r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
int cuInit(unsigned flags) { (void)flags; return mode("nodevice") ? 100 : 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? 0 : 101; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int dev) {
  const char *attrs = getenv("FAKE_CUDA_ATTRS");
  (void)dev;
  if (attrs) {
    for (const char *p = attrs; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
      if (atoi(p) == attr && strchr(p, '=')) { *v = atoi(strchr(p, '=') + 1); return 0; }
    }
    return 1;
  }
  *v = mode("geforce") ? 0 : 1;
  return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = (void *)0x1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuMemAlloc_v2(unsigned long long *p, size_t size) { (void)size; if (mode("oomgpu")) return 2; *p = 0x7f0000200000ULL; return 0; }
int cuMemFree_v2(unsigned long long p) { (void)p; return 0; }
int cuMemGetHandleForAddressRange(void *handle, unsigned long long p, size_t size, int type, unsigned long long flags) {
  (void)p; (void)size; (void)type; (void)flags;
  if (mode("geforce")) return 801;
  *(int *)handle = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return 0;
}
