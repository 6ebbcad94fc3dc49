// RTLD_NEXT probe (ours): called from this library, dlsym(RTLD_NEXT) must name next_b's symbol.
#define _GNU_SOURCE
#include <dlfcn.h>
const char *probe_sym(void) { return "A"; }
const char *next_probe(void) { const char *(*f)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "probe_sym"); return f ? f() : "none"; }
