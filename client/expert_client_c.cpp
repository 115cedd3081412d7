#include "client/expert_client_c.h"

#include <cstring>

#include "client/expert_client.h"

using expertd::client::Client;
using expertd::client::Lease;

struct expertd_client {
  std::unique_ptr<Client> client;
  Lease lease;
  std::string error;
  int fail(const std::string& e) {
    error = e;
    return -1;
  }
};

extern "C" {

expertd_client* expertd_connect(const char* socket_path, char* err, size_t err_len) {
  auto c = Client::connect(socket_path ? socket_path : "");
  if (!c) {
    if (err && err_len) std::snprintf(err, err_len, "%s", c.error().message.c_str());
    return nullptr;
  }
  auto* h = new expertd_client();
  h->client = std::move(*c);
  return h;
}

void expertd_close(expertd_client* c) {
  delete c;
}
const char* expertd_last_error(const expertd_client* c) {
  return c ? c->error.c_str() : "null handle";
}
uint32_t expertd_n_moe_layers(const expertd_client* c) {
  return static_cast<uint32_t>(c->client->info().layers.size());
}
uint32_t expertd_n_experts(const expertd_client* c) {
  return c->client->info().n_experts;
}
uint32_t expertd_max_experts_per_request(const expertd_client* c) {
  return c->client->info().max_experts_per_request;
}
uint64_t expertd_slot_bytes(const expertd_client* c) {
  return c->client->info().slot_bytes;
}
uint64_t expertd_model_id(const expertd_client* c) {
  return c->client->info().model_id;
}

int expertd_acquire(expertd_client* c, uint32_t layer, const uint32_t* experts, uint32_t n,
                    const void** slot_ptrs, uint8_t* ready) {
  auto l = c->client->acquire(layer, {experts, n});
  if (!l) return c->fail(l.error().message);
  c->lease = std::move(*l);
  for (uint32_t i = 0; i < n; ++i) {
    if (slot_ptrs) slot_ptrs[i] = c->lease.granted(i) ? c->lease.slot_data(i) : nullptr;
    if (ready) ready[i] = c->lease.ready[i];
  }
  return 0;
}

int expertd_wait_ready(expertd_client* c, int index) {
  std::optional<size_t> idx;
  if (index >= 0) idx = static_cast<size_t>(index);
  if (idx && *idx >= c->lease.experts.size()) return c->fail("index out of range");
  auto st = c->client->wait_ready(c->lease, idx);
  return st ? 0 : c->fail(st.error().message);
}

int expertd_release(expertd_client* c) {
  auto st = c->client->release(c->lease);
  return st ? 0 : c->fail(st.error().message);
}

int expertd_prefetch(expertd_client* c, uint32_t layer, const uint32_t* experts, uint32_t n) {
  auto st = c->client->prefetch(layer, {experts, n});
  return st ? 0 : c->fail(st.error().message);
}

}  // extern "C"
