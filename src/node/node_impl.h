/* Internal to src/node: the adversary kit of `worker --adversary` (adversary.c), testing only. */
#ifndef LONGHAUL_NODE_IMPL_H
#define LONGHAUL_NODE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "longhaul/node.h"
#include "longhaul/rollout.h"

/* Changes the weights a cheating worker generates with (other-model, quant4, quant8); a bf16
 * slab of n values in the model's layout. Other modes leave it alone. */
void lh__adv_weights(lh_node_adversary a, uint16_t *slab, size_t n);
/* The sampling parameters it really uses (temperature, top-p). */
void lh__adv_sampling(lh_node_adversary a, lh_sample_params *p);
/* Changes a generated one-group batch before it is encoded (prompt, tokens, members, log-probs,
 * rewards, version). vocab bounds the token ids. */
void lh__adv_batch(lh_node_adversary a, lh_rollout_batch *b, int vocab);
/* slowloris: a thread holding `conns` connections to URL (http://HOST:PORT) open, each sending a
 * request a byte per second, until *stop. Returns a handle for lh__adv_slowloris_stop. */
typedef struct lh__slowloris lh__slowloris;
lh__slowloris *lh__adv_slowloris_start(const char *url, int conns);
void lh__adv_slowloris_stop(lh__slowloris *s);

#endif
