const char *probe_sym(void) { return "B"; }
