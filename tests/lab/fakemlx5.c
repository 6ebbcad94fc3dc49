// The consumer lab's stand-in libmlx5.so.1 (ours, test only): the fake wire is no mlx5 device, so
// mlx5dv_is_supported says no and every direct-verbs entry fails EOPNOTSUPP; consumers that link
// libmlx5 (UCX's libuct_ib_mlx5, Mooncake's engine.so, perftest) load, and take their plain-verbs
// paths.
#include <errno.h>
#include <stddef.h>
#define NOPE_PTR(name) void *name(void) { errno = EOPNOTSUPP; return NULL; }
#define NOPE_INT(name) int name(void) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
int mlx5dv_is_supported(void *device) { (void)device; return 0; }
NOPE_INT(mlx5dv_query_device)
NOPE_PTR(mlx5dv_create_cq)
NOPE_INT(mlx5dv_init_obj)
NOPE_PTR(mlx5dv_create_qp)
NOPE_PTR(mlx5dv_open_device)
NOPE_PTR(mlx5dv_devx_alloc_uar)
void mlx5dv_devx_free_uar(void *uar) { (void)uar; }
NOPE_INT(mlx5dv_devx_general_cmd)
NOPE_PTR(mlx5dv_devx_obj_create)
NOPE_INT(mlx5dv_devx_obj_destroy)
NOPE_INT(mlx5dv_devx_obj_modify)
NOPE_INT(mlx5dv_devx_obj_query)
NOPE_INT(mlx5dv_devx_query_eqn)
NOPE_PTR(mlx5dv_devx_umem_reg)
NOPE_INT(mlx5dv_devx_umem_dereg)
NOPE_INT(mlx5dv_devx_qp_modify)
NOPE_INT(mlx5dv_devx_qp_query)
NOPE_PTR(mlx5dv_create_mkey)
NOPE_INT(mlx5dv_destroy_mkey)
NOPE_PTR(mlx5dv_devx_create_event_channel)
void mlx5dv_devx_destroy_event_channel(void *ch) { (void)ch; }
long mlx5dv_devx_get_event(void) { errno = EOPNOTSUPP; return -1; }
NOPE_INT(mlx5dv_devx_subscribe_devx_event)
NOPE_PTR(mlx5dv_qp_ex_from_ibv_qp_ex) // perftest: its crypto and extended-QP paths
NOPE_INT(mlx5dv_crypto_login)
NOPE_PTR(mlx5dv_dek_create)
NOPE_INT(mlx5dv_dek_destroy)
