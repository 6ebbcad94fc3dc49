// The consumer lab's stand-in libefa.so.1 (ours, test only): perftest links AWS's EFA direct
// verbs; the fake wire is no EFA device, so each entry fails EOPNOTSUPP and perftest takes its
// plain-verbs path.
#include <errno.h>
#include <stddef.h>
int efadv_query_device(void *ctx, void *attr, unsigned inlen) {
  (void)ctx;
  (void)attr;
  (void)inlen;
  return EOPNOTSUPP;
}
void *efadv_create_qp_ex(void *ctx, void *attr, void *efa_attr, unsigned inlen) {
  (void)ctx;
  (void)attr;
  (void)efa_attr;
  (void)inlen;
  errno = EOPNOTSUPP;
  return NULL;
}
void *efadv_create_driver_qp(void *pd, void *attr, unsigned type) {
  (void)pd;
  (void)attr;
  (void)type;
  errno = EOPNOTSUPP;
  return NULL;
}
