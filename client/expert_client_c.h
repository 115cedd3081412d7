/* libexpertclient C API: for engines written in other languages. One handle holds one
 * connection and at most one lease at a time (the daemon's rule). Functions return 0 on
 * success and -1 on failure; expertd_last_error() says why. */
#ifndef EXPERTD_CLIENT_C_H
#define EXPERTD_CLIENT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct expertd_client expertd_client;

/* Returns NULL on failure; the reason is written to err (if err_len > 0). */
expertd_client* expertd_connect(const char* socket_path, char* err, size_t err_len);
void expertd_close(expertd_client* c);
const char* expertd_last_error(const expertd_client* c);

uint32_t expertd_n_moe_layers(const expertd_client* c);
uint32_t expertd_n_experts(const expertd_client* c);
uint32_t expertd_max_experts_per_request(const expertd_client* c);
uint64_t expertd_slot_bytes(const expertd_client* c);
uint64_t expertd_model_id(const expertd_client* c);

/* Acquires n experts of a pack layer; slot_ptrs[i] receives each slot's address (read-only).
 * ready[i] is 1 when the slot may be read now. At most the daemon's max_experts_per_request
 * (more are granted in waves, which this API does not hand out: their slot_ptrs are NULL). */
int expertd_acquire(expertd_client* c, uint32_t layer, const uint32_t* experts, uint32_t n,
                    const void** slot_ptrs, uint8_t* ready);
/* Waits until expert `index` of the current lease is ready (index < 0: all of them). */
int expertd_wait_ready(expertd_client* c, int index);
int expertd_release(expertd_client* c);
int expertd_prefetch(expertd_client* c, uint32_t layer, const uint32_t* experts, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif
