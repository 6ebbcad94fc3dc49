// Shared helpers for gdrshim's GPU-machine programs (ours; built there with nvcc).
#pragma once
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = "?"; cuGetErrorString(r_, &s_); \
  fprintf(stderr, "FAIL %s:%d %s -> %d %s\n", __FILE__, __LINE__, #x, (int)r_, s_); exit(1); } } while (0)
#define CKRT(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "FAIL %s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

#include "../../include/gdrshim.h" // struct gdrshim_backing, gdrshim_counters and the gdrshim_dl_* calls

static void mark(const char *s) {
  void (*f)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "gdrshim_mark");
  if (f) f(s);
}
