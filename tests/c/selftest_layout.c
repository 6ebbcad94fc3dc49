// The layout of every verbs struct and field gdrshim-tool's self-test uses, from rdma-core's
// <infiniband/verbs.h> (libibverbs-dev): "name size" and "name.field offset" lines, compared with
// the Rust definitions (tools/src/selftest/ffi.rs, layout_lines) by the tool's layout test.
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#define S(name, t) printf("%s %zu\n", name, sizeof(t))
#define O(name, t, f) printf("%s.%s %zu\n", name, #f, offsetof(t, f))
// a field inside a union, under the name the Rust struct gives it
#define OU(name, t, f, shown) printf("%s.%s %zu\n", name, shown, offsetof(t, f))
int main(void) {
  S("ibv_gid", union ibv_gid);
  S("ibv_port_attr", struct ibv_port_attr);
  O("ibv_port_attr", struct ibv_port_attr, state);
  O("ibv_port_attr", struct ibv_port_attr, active_mtu);
  O("ibv_port_attr", struct ibv_port_attr, gid_tbl_len);
  O("ibv_port_attr", struct ibv_port_attr, lid);
  O("ibv_port_attr", struct ibv_port_attr, active_width);
  O("ibv_port_attr", struct ibv_port_attr, active_speed);
  O("ibv_port_attr", struct ibv_port_attr, link_layer);
  S("ibv_wc", struct ibv_wc);
  O("ibv_wc", struct ibv_wc, wr_id);
  O("ibv_wc", struct ibv_wc, status);
  O("ibv_wc", struct ibv_wc, opcode);
  O("ibv_wc", struct ibv_wc, vendor_err);
  O("ibv_wc", struct ibv_wc, byte_len);
  O("ibv_wc", struct ibv_wc, qp_num);
  S("ibv_sge", struct ibv_sge);
  O("ibv_sge", struct ibv_sge, addr);
  O("ibv_sge", struct ibv_sge, length);
  O("ibv_sge", struct ibv_sge, lkey);
  S("ibv_send_wr", struct ibv_send_wr);
  O("ibv_send_wr", struct ibv_send_wr, wr_id);
  O("ibv_send_wr", struct ibv_send_wr, next);
  O("ibv_send_wr", struct ibv_send_wr, sg_list);
  O("ibv_send_wr", struct ibv_send_wr, num_sge);
  O("ibv_send_wr", struct ibv_send_wr, opcode);
  O("ibv_send_wr", struct ibv_send_wr, send_flags);
  OU("ibv_send_wr", struct ibv_send_wr, wr.rdma.remote_addr, "remote_addr");
  OU("ibv_send_wr", struct ibv_send_wr, wr.rdma.rkey, "rkey");
  S("ibv_recv_wr", struct ibv_recv_wr);
  O("ibv_recv_wr", struct ibv_recv_wr, wr_id);
  O("ibv_recv_wr", struct ibv_recv_wr, next);
  O("ibv_recv_wr", struct ibv_recv_wr, sg_list);
  O("ibv_recv_wr", struct ibv_recv_wr, num_sge);
  S("ibv_qp_cap", struct ibv_qp_cap);
  S("ibv_qp_init_attr", struct ibv_qp_init_attr);
  O("ibv_qp_init_attr", struct ibv_qp_init_attr, send_cq);
  O("ibv_qp_init_attr", struct ibv_qp_init_attr, recv_cq);
  O("ibv_qp_init_attr", struct ibv_qp_init_attr, cap);
  O("ibv_qp_init_attr", struct ibv_qp_init_attr, qp_type);
  O("ibv_qp_init_attr", struct ibv_qp_init_attr, sq_sig_all);
  S("ibv_global_route", struct ibv_global_route);
  S("ibv_ah_attr", struct ibv_ah_attr);
  O("ibv_ah_attr", struct ibv_ah_attr, grh.dgid);
  O("ibv_ah_attr", struct ibv_ah_attr, grh.sgid_index);
  O("ibv_ah_attr", struct ibv_ah_attr, grh.hop_limit);
  O("ibv_ah_attr", struct ibv_ah_attr, dlid);
  O("ibv_ah_attr", struct ibv_ah_attr, is_global);
  O("ibv_ah_attr", struct ibv_ah_attr, port_num);
  S("ibv_qp_attr", struct ibv_qp_attr);
  O("ibv_qp_attr", struct ibv_qp_attr, qp_state);
  O("ibv_qp_attr", struct ibv_qp_attr, path_mtu);
  O("ibv_qp_attr", struct ibv_qp_attr, rq_psn);
  O("ibv_qp_attr", struct ibv_qp_attr, sq_psn);
  O("ibv_qp_attr", struct ibv_qp_attr, dest_qp_num);
  O("ibv_qp_attr", struct ibv_qp_attr, qp_access_flags);
  O("ibv_qp_attr", struct ibv_qp_attr, ah_attr);
  O("ibv_qp_attr", struct ibv_qp_attr, alt_ah_attr);
  O("ibv_qp_attr", struct ibv_qp_attr, pkey_index);
  O("ibv_qp_attr", struct ibv_qp_attr, max_rd_atomic);
  O("ibv_qp_attr", struct ibv_qp_attr, max_dest_rd_atomic);
  O("ibv_qp_attr", struct ibv_qp_attr, min_rnr_timer);
  O("ibv_qp_attr", struct ibv_qp_attr, port_num);
  O("ibv_qp_attr", struct ibv_qp_attr, timeout);
  O("ibv_qp_attr", struct ibv_qp_attr, retry_cnt);
  O("ibv_qp_attr", struct ibv_qp_attr, rnr_retry);
  O("ibv_qp_attr", struct ibv_qp_attr, rate_limit);
  S("ibv_mr", struct ibv_mr);
  O("ibv_mr", struct ibv_mr, addr);
  O("ibv_mr", struct ibv_mr, length);
  O("ibv_mr", struct ibv_mr, lkey);
  O("ibv_mr", struct ibv_mr, rkey);
  O("ibv_qp", struct ibv_qp, context);
  O("ibv_qp", struct ibv_qp, qp_num);
  O("ibv_cq", struct ibv_cq, context);
  S("ibv_context_ops", struct ibv_context_ops);
  O("ibv_context_ops", struct ibv_context_ops, poll_cq);
  O("ibv_context_ops", struct ibv_context_ops, post_send);
  O("ibv_context_ops", struct ibv_context_ops, post_recv);
  S("ibv_context", struct ibv_context);
  O("ibv_context", struct ibv_context, ops);
  O("ibv_context", struct ibv_context, abi_compat);
  return 0;
}
