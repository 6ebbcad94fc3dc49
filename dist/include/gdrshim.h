/* gdrshim: query interface of libgdrshim.so (found with dlsym(RTLD_DEFAULT, ...), so nothing
 * links against it).
 *
 * Environment (read once):
 *   GDRSHIM_MODE       off | trace | shadow (default shadow). off is a pure pass-through.
 *   GDRSHIM_LOG_LEVEL  error | warn | info | debug | trace (default warn; info in trace mode).
 *   GDRSHIM_LOG_FILE   log file instead of stderr; %h = host, %p = pid; opened O_APPEND|O_NOFOLLOW, 0600.
 *   GDRSHIM_CAPTURE    write a raw capture of every NVIDIA ioctl (our fixture format); %h, %p.
 *   GDRSHIM_SUMMARY    1 (default) prints "gdrshim: summary key=value ..." at exit; 0 does not.
 * Bad values give one warning naming the variable, then the default.
 */
#ifndef GDRSHIM_H
#define GDRSHIM_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define GDRSHIM_QUERY_ABI 1
#define GDRSHIM_GPU_PAGE_SIZE (64u << 10) /* NV503C registers in 64 KiB units */

struct gdrshim_backing {
  uint32_t struct_version; /* GDRSHIM_QUERY_ABI */
  uint32_t h_client, h_memory, h_device, device_id;
  int32_t ctl_fd;          /* the /dev/nvidiactl fd the client was allocated on */
  uint64_t offset;         /* offset of va inside h_memory */
  uint64_t map_base, map_length; /* the UVM mapping the range lies in */
};

const char *gdrshim_version(void);        /* "0.1.0" */
int gdrshim_mode(void);                   /* 0 off, 1 trace, 2 shadow */
/* Exact lookup of [va, va+len): 0 on a hit inside one memory object; -ENOENT miss;
 * -EXDEV spans memory objects; -ENOSYS nothing tracked (off mode or unknown driver). */
int gdrshim_lookup(uint64_t va, uint64_t len, struct gdrshim_backing *out);
void gdrshim_mark(const char *text);      /* a mark line in the capture file */

#ifdef __cplusplus
}
#endif
#endif
