// The C API, used the way an engine in another language would: only expert_client_c.h.
#include "client/expert_client_c.h"
#include "daemon/fixture.h"

using namespace expertd::test;

TEST_F(DaemonTest, CApiAcquiresWaitsAndReleases) {
  auto d = start({"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"});
  char err[256] = {};
  expertd_client* c = expertd_connect(socket().c_str(), err, sizeof err);
  ASSERT_NE(c, nullptr) << err;
  EXPECT_EQ(expertd_n_moe_layers(c), kLayers);
  EXPECT_EQ(expertd_n_experts(c), kExperts);
  EXPECT_EQ(expertd_max_experts_per_request(c), 4u);
  EXPECT_EQ(expertd_model_id(c), manifest_->model_id);
  uint32_t ids[2] = {3, 30};
  const void* ptrs[2] = {};
  uint8_t ready[2] = {9, 9};
  ASSERT_EQ(expertd_acquire(c, 1, ids, 2, ptrs, ready), 0) << expertd_last_error(c);
  EXPECT_EQ(ready[0], 0);
  ASSERT_EQ(expertd_wait_ready(c, -1), 0) << expertd_last_error(c);
  // The slot holds the expert's down projection where the manifest says.
  const auto& L = manifest_->layers[1];
  const auto* down = L.find(expertd::pack::Role::Down);
  const auto* t = source_->tensor(down->tensor);
  EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(ptrs[1]) + down->offset,
                           t->data + 30 * down->bytes, down->bytes));
  EXPECT_EQ(expertd_release(c), 0);
  uint32_t bad[1] = {99};
  EXPECT_EQ(expertd_acquire(c, 0, bad, 1, ptrs, ready), -1);
  EXPECT_NE(std::string(expertd_last_error(c)).find("OutOfRange"), std::string::npos);
  expertd_close(c);
  EXPECT_EQ(expertd_connect((local_ / "nope.sock").c_str(), err, sizeof err), nullptr);
  EXPECT_NE(std::string(err).find("connect"), std::string::npos) << err;
}
