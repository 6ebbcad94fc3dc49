#include <stdio.h>
const char *next_probe(void);
int main(void) { printf("next=%s\n", next_probe()); return 0; }
