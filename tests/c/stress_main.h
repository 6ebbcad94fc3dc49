// tests/c/stress.c's threads and its end (included once): the workers, the fd churn, the
// watchdog, and the checks after every worker is done.
#pragma once

// ---- the churn: numbers gdrshim keeps closed or replaced, files of the program's put there ----
typedef struct {
  int fd;
  char mark[48];
} pfile_t;
static pfile_t pf[16];
static int npf;
static unsigned long marks;
// A file of the program's own at `at` (-1: at the lowest free number), holding a mark of its own.
static int own_file(int at) {
  int fd = memfd_create("stress-program-file", MFD_CLOEXEC);
  if (fd < 0) {
    failed("memfd_create", 0, errno);
    return -1;
  }
  if (at >= 0 && fd != at) {
    errno = SENT;
    int r = rnd(2) ? dup2(fd, at) : dup3(fd, at, O_CLOEXEC);
    if (r != at) {
      failed("dup2 over a number", at, errno);
      close(fd);
      return -1;
    }
    errno_kept("errno changed by dup2/dup3", at);
    close(fd);
    fd = at;
  }
  pfile_t *p = &pf[npf++];
  p->fd = fd;
  int n = snprintf(p->mark, sizeof p->mark, "program file %d #%lu", fd, ++marks);
  if (pwrite(fd, p->mark, (size_t)n, 0) != n) failed("the program writes its file", fd, errno);
  __atomic_store_n(&prog_fd[fd], 1, __ATOMIC_SEQ_CST);
  return fd;
}
// Each file of the program's still holds its mark; one that does not is reported once and
// forgotten (its number is not the program's file any more: never closed by the program).
static void verify_files(void) {
  for (int i = npf - 1; i >= 0; i--) {
    char b[64] = {0};
    ssize_t n = pread(pf[i].fd, b, sizeof b - 1, 0);
    if (n >= 0 && !strcmp(b, pf[i].mark)) continue;
    say("file at %d holds \"%s\" (%zd), not \"%s\"\n", pf[i].fd, b, n, pf[i].mark);
    violation("a file of the program's was closed or changed", (uint64_t)pf[i].fd, (uint64_t)n);
    __atomic_store_n(&prog_fd[pf[i].fd], 0, __ATOMIC_SEQ_CST);
    pf[i] = pf[--npf];
  }
}
static void drop_file(int i) {
  __atomic_store_n(&prog_fd[pf[i].fd], 0, __ATOMIC_SEQ_CST);
  errno = SENT;
  if (close(pf[i].fd)) failed("close of the program's file", pf[i].fd, errno);
  else errno_kept("errno changed by close", pf[i].fd);
  pf[i] = pf[--npf];
}
static void churn_once(void) {
  int cand[256], n = 0;
  char p[64], t[256];
  for (int fd = 3; fd < 256; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    if (!prog_fd[fd] && readlink(p, t, sizeof t) > 0) cand[n++] = fd;
  }
  if (!n) return;
  int k = cand[rnd((unsigned)n)], hi = k, r = 0, how = (int)rnd(5);
  count(K_CHURN);
  op_begin("churn", (uint64_t)k, (uint64_t)how);
  errno = SENT;
  switch (how) {
  case 0: r = close(k); break;
  case 1: r = close_range((unsigned)k, (unsigned)k, 0); break;
  case 2: // a run of numbers none of which is the program's, as a daemon's closefrom does
    while (hi + 1 < 256 && !prog_fd[hi + 1] && hi - k < 6) hi++;
    r = close_range((unsigned)k, (unsigned)hi, 0);
    break;
  default: op_end(own_file(k)); return; // dup2/dup3 of the program's file over it
  }
  op_end(r);
  // (EBADF: gdrshim closed its own number meanwhile, a dereg's)
  if (r && errno != EBADF) failed("close of a number", k, errno);
  if (!r) errno_kept("errno changed by close/close_range", k);
  own_file(rnd(2) ? k : -1);
}
static void *churn(void *arg) {
  (void)arg;
  tid_no = threads;
  rng = seed * 0x2545f4914f6cdd1dull + 7777;
  while (!__atomic_load_n(&stop_churn, __ATOMIC_ACQUIRE)) {
    usleep(200 + rnd(1500));
    pthread_rwlock_wrlock(&fdlock);
    verify_files();
    churn_once();
    while (npf > 12) drop_file(0);
    pthread_rwlock_unlock(&fdlock);
  }
  return NULL;
}

// ---- the watchdog: a worker silent for 30 s, or the run 120 s past its end, is a hang ----
static void *watchdog(void *arg) {
  (void)arg;
  for (;;) {
    usleep(500000);
    double t = now();
    for (int i = 0; i < threads; i++)
      if (beats[i] && t - beats[i] > 30) {
        say("VIOLATION a hang: worker %d silent for %.0f s (seed %lu)\n", i, t - beats[i], seed);
        _exit(3);
      }
    if (t > deadline + 120) {
      say("VIOLATION a hang: the run is 120 s past its end (seed %lu)\n", seed);
      _exit(3);
    }
  }
  return NULL;
}

// Each GPU's primary context, which the program holds; a worker's current context is one of them
// (as cudaSetDevice makes it), so its allocations are made in it.
static void *primary[2];

static void *worker(void *arg) {
  tid_no = (int)(intptr_t)arg;
  ctx_set_current(primary[tid_no % 2]);
  rng = (seed + 1) * 0x9e3779b97f4a7c15ull + (unsigned long)tid_no * 0xbf58476d1ce4e5b9ull + 1;
  alive();
  while (now() < deadline) {
    int reg = (int)rnd(REGIONS), z = 0;
    for (int i = 0; i < REGIONS && !__atomic_compare_exchange_n(&rstate[reg], &z, 1, 0,
                                                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
         i++)
      reg = (reg + 1) % REGIONS, z = 0;
    if (z) {
      usleep(1000);
      continue;
    }
    rowner[reg] = tid_no;
    cycle(reg);
    pthread_mutex_lock(&bmu);
    __atomic_store_n(&rstate[reg], 0, __ATOMIC_RELEASE);
    rfreeing[reg] = 0;
    pthread_mutex_unlock(&bmu);
    alive();
  }
  beats[tid_no] = 0;
  return NULL;
}

// After every worker: nothing registered or exported left, no fd of gdrshim's but its GPU nodes.
static void final_checks(void) {
  int nodes[2] = {0, 0};
  char p[64], t[512];
  for (int fd = 3; fd < 4096; fd++) {
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0 || prog_fd[fd]) continue;
    t[k] = 0;
    int g = strstr(t, "/nvidia0") ? 0 : strstr(t, "/nvidia1") ? 1 : -1;
    if (g >= 0 && !nodes[g]++) continue;
    say("fd %d left: %s\n", fd, t);
    violation("an fd left at the end (gdrshim's, or one it never closed)", (uint64_t)fd, 0);
  }
  int (*bufs)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakenv_dmabufs_open");
  if (bufs && bufs()) violation("dma-buf fds left at the end", (uint64_t)bufs(), 0);
  struct gdrshim_counters c;
  memset(&c, 0xff, sizeof c);
  if (gdrshim_dl_counters(&c, sizeof c) < 0) violation("no counters", 0, 0);
  if (c.live_registrations || c.dmabuf_buffers || c.registered != c.unregistered)
    violation("gdrshim holds registrations at the end (live, buffers)", c.live_registrations,
              c.dmabuf_buffers);
  int route = gdrshim_dl_gdr_route();
  if (route != (dmabuf_route ? 1 : 2))
    violation("the machine's route is not the one asked for", (uint64_t)route, 0);
}

// `stress fdcheck`: what spawn_op's children exec. Exit 0 when this process holds no fd of
// gdrshim's (a dma-buf, a GPU node), 3 when it does.
static int fdcheck(void) {
  char p[300], t[512];
  int bad = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return 2;
  for (struct dirent *e; (e = readdir(d));) {
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, t, sizeof t - 1);
    if (k <= 0) continue;
    t[k] = 0;
    if (strstr(t, "memfd:nv_dmabuf") || strstr(t, "/nvidia0") || strstr(t, "/nvidia1")) {
      say("a spawned child holds fd %s: %s\n", e->d_name, t);
      bad = 1;
    }
  }
  closedir(d);
  return bad ? 3 : 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "fdcheck")) return fdcheck();
  if (argc < 5) {
    fprintf(stderr,
            "usage: stress SEED THREADS SECONDS dmabuf|nv503c [nochurn] [nofork] [nospawn] "
            "[nocloses] [ctx] [sabotage]\n");
    return 2;
  }
  seed = strtoul(argv[1], NULL, 0);
  threads = atoi(argv[2]);
  seconds = atoi(argv[3]);
  dmabuf_route = !strcmp(argv[4], "dmabuf");
  for (int i = 5; i < argc; i++) {
    churn_on &= strcmp(argv[i], "nochurn") != 0;
    fork_on &= strcmp(argv[i], "nofork") != 0;
    spawn_on &= strcmp(argv[i], "nospawn") != 0;
    closes_on &= strcmp(argv[i], "nocloses") != 0;
    ctx_created_on |= !strcmp(argv[i], "ctx");
    sabotage |= !strcmp(argv[i], "sabotage");
  }
  if (threads < 1 || threads > 200 || seconds < 1) return 2;
  ssize_t k = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (k <= 0) return 2;
  self_exe[k] = 0;
  // own_closes' numbers from HIGH_FDS up, below prog_fd's end
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) || (nofile.rlim_cur < 4096 && nofile.rlim_max >= 4096 &&
                                            (nofile.rlim_cur = 4096, setrlimit(RLIMIT_NOFILE, &nofile)))) {
    fprintf(stderr, "stress: no RLIMIT_NOFILE of 4096\n");
    return 2;
  }
  if (nofile.rlim_cur < 4096) {
    fprintf(stderr, "stress: RLIMIT_NOFILE %lu, 4096 needed\n", (unsigned long)nofile.rlim_cur);
    return 2;
  }
  // what the process has before it touches a GPU is the program's (inherited, stdio)
  for (int fd = 0; fd < 4096; fd++) prog_fd[fd] = fcntl(fd, F_GETFD) >= 0;
  setup();
  prog_client = client;
  prog_fd[ctl] = prog_fd[uvm] = 1;
  cuda_setup();
  for (int g = 0; g < 2; g++)
    if (ctx_retain(&primary[g], g)) {
      fprintf(stderr, "stress: cuDevicePrimaryCtxRetain %d\n", g);
      return 2;
    }
  verbs_setup();
  if (dmabuf_route != new_verbs) {
    fprintf(stderr, "stress: route %s, but libibverbs is %s\n", argv[4],
            new_verbs ? "34+" : "older");
    return 2;
  }
  gdr_active = must(dlsym(RTLD_DEFAULT, "gdrshim_gdr_active"), "gdrshim_gdr_active");
  void **o = must(dlsym(RTLD_DEFAULT, "fakerm_oracle"), "fakerm_oracle (the fake driver)");
  __atomic_store_n(o, (void *)oracle, __ATOMIC_RELEASE);
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&fdlock, &ra);
  printf("stress seed=%lu threads=%d seconds=%d route=%s churn=%d fork=%d spawn=%d closes=%d "
         "ctx_created=%d%s\n",
         seed, threads, seconds, argv[4], churn_on, fork_on, spawn_on, closes_on, ctx_created_on,
         sabotage ? " sabotage" : "");
  fflush(stdout);
  double t0 = now();
  deadline = t0 + seconds;
  pthread_t w[200], ch, wd;
  pthread_create(&wd, NULL, watchdog, NULL);
  if (churn_on) pthread_create(&ch, NULL, churn, NULL);
  for (int i = 0; i < threads; i++) pthread_create(&w[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < threads; i++) pthread_join(w[i], NULL);
  if (churn_on) {
    __atomic_store_n(&stop_churn, 1, __ATOMIC_RELEASE);
    pthread_join(ch, NULL);
  }
  tid_no = threads + 1;
  verify_files();
  while (npf) drop_file(0);
  final_checks();
  unsigned long ops = 0;
  for (int k = 0; k < K_N; k++)
    if (k != K_REG_OK && k != K_PROBE_OK && k != K_REREG_OK && k != K_EXPORT_OK && k != K_UMEM_OK &&
        k != K_CYCLE)
      ops += kc[k];
  printf("stress %lu %d %d %s %s ops=%lu violations=%ld failures=%ld wall=%.1f", seed, threads,
         seconds, argv[4], violations ? "FAILED" : "ok", ops, violations, fails, now() - t0);
  for (int k = 0; k < K_N; k++) printf(" %s=%lu", k_names[k], kc[k]);
  printf(" oracle_export=%lu oracle_vidmem=%lu oracle_nic=%lu oracle_release=%lu", asked[0],
         asked[1], asked[2], asked[3]);
  printf("\n");
  for (int i = 0; i < 16 && vkinds[i]; i++)
    printf("stress violations %ld: %s\n", vcounts[i], vkinds[i]);
  return violations ? 1 : 0;
}
