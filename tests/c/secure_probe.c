// Run setgid (ours): reports AT_SECURE and what the preloaded shim says of itself.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <unistd.h>
int main(void) {
  int (*mode)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gdrshim_mode");
  // NVIDIA-looking traffic the shim would otherwise initialise on and log about
  int fd = open("/dev/null", O_RDWR); unsigned char a[32] = {0}; ioctl(fd, 0xC020462A, a); close(fd);
  printf("secure=%lu loaded=%d mode=%d\n", getauxval(AT_SECURE), mode != NULL, mode ? mode() : -1);
  return 0;
}
