// Lab hosts talking over the fake wire (ours): what labpair.c (the program, its rendezvous and
// verbs helpers) and labpair_cases.c (the scenarios between hosts) share.
#ifndef LABPAIR_H
#define LABPAIR_H
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern int checks, self, nhosts, gpu; // checks: those a run passed
extern const char *rdv;
extern struct ibv_context *ctx;
extern struct ibv_pd *pd;
extern struct ibv_comp_channel *ch;
extern struct ibv_cq *cq;
extern union ibv_gid my_gid;
extern uint64_t addr2; // a second address to publish (errors: an MR without remote read)
#define REQUIRE(c, ...)                                                                            \
  do {                                                                                             \
    if (!(c)) {                                                                                    \
      fprintf(stderr, "labpair host %d: FAILED %s:%d: %s: ", self, __FILE__, __LINE__, #c);        \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)
#define CHECK(c, ...)                                                                              \
  do {                                                                                             \
    REQUIRE(c, __VA_ARGS__);                                                                       \
    checks++;                                                                                      \
  } while (0) // counted: the checks a run passed
enum {
  ALL = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
  CH = 65536
};
typedef struct {
  union ibv_gid gid;
  uint32_t rkey, ud;
  uint64_t addr, addr2;
  uint32_t qpn[64];
  int pid;
} peer;

double now_ms(void);
void put(const char *name, const char *text);
void get(const char *name, char *buf, size_t n); // waits for it (20 s at most)
void barrier(const char *step);
struct ibv_mr *memory(size_t n, int access, uint8_t **out);
struct ibv_qp *rc_qp(struct ibv_srq *srq);
void connect_rc(struct ibv_qp *q, const union ibv_gid *gid, uint32_t qpn, int access, int timeout);
void post(struct ibv_qp *q, enum ibv_wr_opcode op, void *buf, uint32_t len, uint32_t lkey,
          uint64_t raddr, uint32_t rkey, uint64_t id);
void post_recv(struct ibv_qp *q, struct ibv_srq *srq, void *buf, uint32_t len, uint32_t lkey,
               uint64_t id);
struct ibv_wc next_wc(void);
void fill(uint8_t *p, size_t n, int from, int to);
size_t wrong(const uint8_t *p, size_t n, int from, int to, long *first);
void publish(uint32_t rkey, uint64_t addr, uint32_t ud, uint32_t *qpn, int nq);
peer lookup(int h, int nq);
// the scenarios (labpair_cases.c)
void mesh(void);
void errors(void);
void retry(int peer_exits);
void stream(void);
void blocked(void); // 2 hosts, labpair-gpu only
#endif
