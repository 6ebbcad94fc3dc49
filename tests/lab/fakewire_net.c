// The consumer lab's fake wire (ours): the wire between processes. Every process that opens the
// fake HCA runs one thread of the wire. With FAKEWIRE_LAB set it listens on an abstract unix
// socket named by the lab, its host and its pid, and a QP number names its process through a file
// (DIR/run/hostN/qp/<qpn>: the pid). A request goes to the process that owns its destination QP
// (found by the GID's host and the QP number) on one connection per pair of processes; that
// process's wire thread does what the responder does (fakewire_resp.c) in its own memory, GPU
// memory through its own libcuda, and answers on the same connection. A request that cannot be
// delivered (link or port down, no such QP, the process gone) gets no answer, and its QP
// completes it RETRY_EXC_ERR once the HCA's retries would have run out: 4.096 us x 2^timeout x
// (retry_cnt + 1), capped by FAKEWIRE_RETRY_MS_MAX when set (timeout 0 waits for ever, as the
// spec says, unless capped), and at least FAKEWIRE_RETRY_MS_MIN when set (processes that share a
// few busy cores answer later than an HCA: a live peer is not taken for a dead one). Faults are
// read from the lab's fault file on every message.
#define _GNU_SOURCE
#include "fakewire.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct out {
  struct out *next;
  fw_msg m;
  uint8_t *pay;
  size_t off;
  double ready;
} out;
typedef struct fw_conn {
  int fd, host, pid, dead, inbound;
  fw_msg hdr;
  size_t got;
  uint8_t *pay; // the message being read: header, then payload
  out *q, **q_tail; // what waits to be written
  double free_at; // ms: when the link is free again under a cap
} fw_conn;
#define FW_MAXCONN 1024
static fw_conn *conns[FW_MAXCONN];
static int nconns, listen_fd = -1, wake_fd = -1;
static pthread_t wire_thread;
static char lab_id[64]; // the lab directory's device and inode: names its sockets

int64_t fw_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}
static double now_f(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
int64_t fw_retry_ms(const fw_qp *q) {
  unsigned t = q->attr.timeout, r = q->attr.retry_cnt;
  const char *v = getenv("FAKEWIRE_RETRY_MS_MAX");
  long cap = v && *v ? atol(v) : 0;
  const char *m = getenv("FAKEWIRE_RETRY_MS_MIN");
  long floor_ms = m && *m ? atol(m) : 0;
  if (t == 0) return cap > 0 ? cap : -1;
  double ms = 4.096e-3 * (double)(1ull << (t > 31 ? 31 : t)) * (r + 1);
  if (floor_ms > 0 && ms < floor_ms) ms = (double)floor_ms;
  if (cap > 0 && ms > cap) ms = (double)cap;
  return ms < 1 ? 1 : (int64_t)ms;
}

// ---- connections ----
static const char *kind_name(uint32_t k) { return k == FW_M_REQ ? "REQ" : k == FW_M_RSP ? "RSP" : "HELLO"; }
static void trace_msg(const char *what, const fw_msg *m, int host, int pid) {
  if (fw_tracing())
    fw_trace("%s %s op=%u qpn %#x->%#x seq=%llu len=%llu paylen=%llu status=%u peer host %d pid %d", what,
             kind_name(m->kind), m->op, m->src_qpn, m->dst_qpn, (unsigned long long)m->seq,
             (unsigned long long)m->len, (unsigned long long)m->paylen, m->status, host, pid);
}
static void sock_name(struct sockaddr_un *a, socklen_t *len, int host, int pid) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "fakewire-%s-%d-%d", lab_id, host, pid);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}
static void wake(void) {
  uint64_t one = 1;
  if (wake_fd >= 0 && write(wake_fd, &one, sizeof one) < 0) {}
}
static void conn_dead(fw_conn *c) {
  if (c->dead) return;
  c->dead = 1;
  close(c->fd);
  for (out *o = c->q, *n; o; o = n) { // never sent: their requesters time out
    n = o->next;
    if (o->m.kind == FW_M_REQ) fw_req_sent(o->m.src_qpn, o->m.seq, NULL, 1);
    free(o->pay);
    free(o);
  }
  c->q = NULL;
  c->q_tail = &c->q;
  free(c->pay);
  c->pay = NULL;
  fw_conn_lost(c);
}
static fw_conn *conn_new(int fd, int host, int pid, int inbound) {
  if (nconns == FW_MAXCONN) {
    close(fd);
    return NULL;
  }
  fw_conn *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  c->fd = fd;
  c->host = host;
  c->pid = pid;
  c->inbound = inbound;
  c->q_tail = &c->q;
  conns[nconns++] = c;
  return c;
}
static void enqueue(fw_conn *c, const fw_msg *m, uint8_t *pay);
static fw_conn *conn_to(int host, int pid) {
  for (int i = 0; i < nconns; i++)
    if (!conns[i]->inbound && conns[i]->host == host && conns[i]->pid == pid)
      return conns[i]->dead ? NULL : conns[i];
  struct sockaddr_un a;
  socklen_t len;
  sock_name(&a, &len, host, pid);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NULL;
  if (connect(fd, (struct sockaddr *)&a, len)) {
    close(fd);
    return NULL;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  fw_conn *c = conn_new(fd, host, pid, 0);
  if (!c) return NULL;
  fw_msg hello = {.kind = FW_M_HELLO, .src_host = (uint32_t)fw_me()->n, .pid = (uint32_t)getpid()};
  enqueue(c, &hello, NULL);
  return c;
}
// Writes what is due: 0, or -1 when the connection broke.
static int flush(fw_conn *c) {
  double now = now_f();
  while (!c->dead && c->q && c->q->ready <= now) {
    out *o = c->q;
    size_t h = sizeof o->m, total = h + o->m.paylen;
    struct iovec v[2];
    int nv = 0;
    if (o->off < h) v[nv++] = (struct iovec){(uint8_t *)&o->m + o->off, h - o->off};
    if (o->m.paylen)
      v[nv++] = (struct iovec){o->pay + (o->off > h ? o->off - h : 0),
                               o->m.paylen - (o->off > h ? o->off - h : 0)};
    // MSG_NOSIGNAL: a peer that went away is a dead connection, not SIGPIPE in the program
    struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)nv};
    ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (k <= 0) {
      conn_dead(c);
      return -1;
    }
    o->off += (size_t)k;
    if (o->off < total) return 0;
    c->q = o->next;
    if (!c->q) c->q_tail = &c->q;
    trace_msg("written", &o->m, c->host, c->pid);
    if (o->m.kind == FW_M_REQ) fw_req_sent(o->m.src_qpn, o->m.seq, c, 1);
    free(o->pay);
    free(o);
  }
  return 0;
}
// Puts m on c (taking pay), as the link's faults say: dropped when down, the first payload byte
// inverted when corrupt, released no sooner than a capped link would carry it.
static void enqueue(fw_conn *c, const fw_msg *m, uint8_t *pay) {
  int me = fw_me()->n;
  if (m->kind != FW_M_HELLO &&
      (c->dead || fw_fault_link_down(me, c->host) || fw_fault_port_down(me))) {
    fw_count_wire(0);
    trace_msg("dropped (link down or connection dead)", m, c->host, c->pid);
    if (m->kind == FW_M_REQ) fw_req_sent(m->src_qpn, m->seq, NULL, 1);
    free(pay);
    return;
  }
  out *o = calloc(1, sizeof *o);
  if (!o) {
    free(pay);
    return;
  }
  o->m = *m;
  o->pay = pay;
  if (m->paylen && fw_fault_corrupt(me, c->host)) {
    pay[0] ^= 0xff;
    fw_count_wire(1);
  }
  double cap = m->kind == FW_M_HELLO ? 0 : fw_fault_cap(me, c->host);
  if (cap > 0) {
    double start = c->free_at > now_f() ? c->free_at : now_f();
    c->free_at = start + (double)(sizeof *m + m->paylen) * 1e3 / cap;
    o->ready = c->free_at;
  }
  *c->q_tail = o;
  c->q_tail = &o->next;
  trace_msg("queued", m, c->host, c->pid);
  if (m->kind == FW_M_REQ) fw_req_sent(m->src_qpn, m->seq, c, 0);
  flush(c);
  if (c->q && !pthread_equal(pthread_self(), wire_thread)) wake();
}

// The connection to the process that owns QP qpn of host, or NULL. Owners are remembered (a
// message per lookup would read a file per message); one whose process went away is looked up
// again, since its QP number may now be another process's.
static fw_conn *route(int host, uint32_t qpn) {
  static struct {
    int host, pid;
    uint32_t qpn;
  } seen[256];
  static unsigned next;
  for (unsigned i = 0; i < 256; i++)
    if (seen[i].pid > 0 && seen[i].host == host && seen[i].qpn == qpn) {
      fw_conn *c = conn_to(host, seen[i].pid);
      if (c) return c;
      seen[i].pid = 0;
    }
  int pid = fw_qpn_owner(host, qpn);
  if (pid <= 0 || pid == getpid()) return NULL;
  fw_conn *c = conn_to(host, pid);
  if (c) {
    seen[next % 256].host = host;
    seen[next % 256].qpn = qpn;
    seen[next % 256].pid = pid;
    next++;
  }
  return c;
}
int fw_send(const fw_msg *m, uint8_t *pay) {
  int me = fw_me()->n, host = fw_gid_host(m->dgid);
  if (host == me && fw_qp_by_num(m->dst_qpn)) { // this process: the HCA's loopback
    if (fw_fault_port_down(me)) goto drop;
    trace_msg("loopback", m, me, getpid());
    fw_req_sent(m->src_qpn, m->seq, NULL, 1);
    fw_respond(NULL, m, pay);
    return 0;
  }
  if (host < 0 || !fw_lab_dir()) goto drop;
  fw_conn *c = route(host, m->dst_qpn);
  if (!c) goto drop;
  enqueue(c, m, pay);
  return 1;
drop:
  trace_msg("dropped (port down, no host or no process owns the QP)", m, host, -1);
  fw_count_wire(0);
  fw_req_sent(m->src_qpn, m->seq, NULL, 1);
  free(pay);
  return -1;
}
void fw_reply(struct fw_conn *to, const fw_msg *m, const uint8_t *pay) {
  if (!to) {
    fw_answered(m, pay);
    return;
  }
  uint8_t *copy = NULL;
  if (m->paylen) {
    if (!(copy = malloc(m->paylen))) return; // lost: the requester times out
    memcpy(copy, pay, m->paylen);
  }
  enqueue(to, m, copy);
}

// ---- the wire's thread ----
static void read_conn(fw_conn *c) {
  for (int rounds = 0; rounds < 64 && !c->dead; rounds++) {
    size_t h = sizeof c->hdr;
    ssize_t k;
    if (c->got < h) k = read(c->fd, (uint8_t *)&c->hdr + c->got, h - c->got);
    else k = read(c->fd, c->pay + (c->got - h), c->hdr.paylen - (c->got - h));
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (k <= 0) {
      conn_dead(c);
      return;
    }
    c->got += (size_t)k;
    if (c->got == h && c->hdr.paylen) {
      if (c->hdr.paylen > (1ull << 32) || !(c->pay = malloc(c->hdr.paylen))) {
        conn_dead(c);
        return;
      }
      continue;
    }
    if (c->got < h + c->hdr.paylen) continue;
    fw_msg m = c->hdr;
    uint8_t *pay = c->pay;
    c->pay = NULL;
    c->got = 0;
    trace_msg("received", &m, c->host, c->pid);
    if (m.kind == FW_M_HELLO) {
      c->host = (int)m.src_host;
      c->pid = (int)m.pid;
      free(pay);
    } else if (m.kind == FW_M_REQ && c->inbound) fw_respond(c, &m, pay);
    else if (m.kind == FW_M_RSP && !c->inbound) {
      fw_answered(&m, pay);
      free(pay);
    } else {
      fw_count_error("a message the wire does not expect");
      free(pay);
    }
  }
}
// One pass over the wire without waiting: what a program that polls its CQ drives itself, so
// that a busy poller does not wait for the wire's thread to be scheduled. Under fw_mu.
void fw_wire_progress(void) {
  if (listen_fd >= 0) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) conn_new(fd, -1, -1, 1);
  }
  for (int i = 0; i < nconns; i++) {
    if (!conns[i]->dead) read_conn(conns[i]);
    if (!conns[i]->dead && conns[i]->q) flush(conns[i]);
  }
  fw_expire(fw_now_ms());
}
static void *wire_main(void *arg) {
  (void)arg;
  struct pollfd p[FW_MAXCONN + 2];
  fw_conn *of[FW_MAXCONN + 2];
  pthread_mutex_lock(&fw_mu);
  for (;;) {
    int n = 0, timeout = 100; // the fault file is read again at least this often
    double now = now_f();
    p[n++] = (struct pollfd){wake_fd, POLLIN, 0};
    if (listen_fd >= 0) p[n++] = (struct pollfd){listen_fd, POLLIN, 0};
    for (int i = 0; i < nconns; i++) {
      fw_conn *c = conns[i];
      if (c->dead) continue;
      if (!c->inbound && fw_fault_link_down(fw_me()->n, c->host))
        fw_conn_lost(c); // retries go nowhere
      short ev = POLLIN;
      if (c->q && c->q->ready <= now) ev |= POLLOUT;
      else if (c->q && c->q->ready - now < timeout) timeout = (int)(c->q->ready - now) + 1;
      of[n] = c;
      p[n++] = (struct pollfd){c->fd, ev, 0};
    }
    int64_t due = fw_expire(fw_now_ms());
    if (due && due - fw_now_ms() < timeout) timeout = (int)(due - fw_now_ms()) + 1;
    pthread_mutex_unlock(&fw_mu);
    int k = poll(p, (nfds_t)n, timeout);
    pthread_mutex_lock(&fw_mu);
    if (k < 0) continue;
    for (int i = 0; i < n; i++) {
      if (!p[i].revents) continue;
      if (p[i].fd == wake_fd) {
        uint64_t v;
        if (read(wake_fd, &v, sizeof v) < 0) {}
      } else if (p[i].fd == listen_fd) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) conn_new(fd, -1, -1, 1);
      } else {
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) read_conn(of[i]);
        if (!of[i]->dead) flush(of[i]);
      }
    }
    for (int i = 0; i < nconns; i++)
      if (!conns[i]->dead && conns[i]->q) flush(conns[i]);
  }
  return NULL;
}
static void start(void) {
  wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const char *lab = fw_lab_dir();
  if (lab) {
    struct stat st;
    mkdir(lab, 0755); // DIR/host made it already; a program started by hand may not have
    if (!stat(lab, &st))
      snprintf(lab_id, sizeof lab_id, "%lx-%lx", (unsigned long)st.st_dev,
               (unsigned long)st.st_ino);
    struct sockaddr_un a;
    socklen_t len;
    sock_name(&a, &len, fw_me()->n, getpid());
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, len) || listen(listen_fd, 128)) {
      fprintf(stderr, "fakewire: cannot listen for the wire: %s\n", strerror(errno));
      if (listen_fd >= 0) close(listen_fd);
      listen_fd = -1;
    }
  }
  sigset_t all, old; // the wire's thread takes no signal of the program's
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  if (pthread_create(&wire_thread, NULL, wire_main, NULL))
    fprintf(stderr, "fakewire: no thread for the wire\n");
  else pthread_detach(wire_thread);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}
void fw_wire_start(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, start);
}

// At exit, what is already due still leaves (a last answer a peer waits for), within a second.
__attribute__((destructor)) static void drain_at_exit(void) {
  if (wake_fd < 0) return;
  pthread_mutex_lock(&fw_mu);
  int64_t end = fw_now_ms() + 1000;
  for (int i = 0; i < nconns; i++) {
    fw_conn *c = conns[i];
    while (!c->dead && c->q && c->q->ready <= now_f() && fw_now_ms() < end) {
      struct pollfd p = {c->fd, POLLOUT, 0};
      if (poll(&p, 1, (int)(end - fw_now_ms())) <= 0) break;
      flush(c);
    }
  }
  pthread_mutex_unlock(&fw_mu);
}
