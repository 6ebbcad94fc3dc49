// A library planted under the core's name (issue 29; ours): its constructor leaves a mark file
// ($PLANTED_MARK), which must never appear.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
  const char *m = getenv("PLANTED_MARK");
  if (m) close(open(m, O_CREAT | O_WRONLY, 0600));
}
