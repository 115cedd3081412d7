// The residency board (proto/board.h): engines pin hits without a round trip, and the daemon
// never reuses a slot an engine pinned that way. Real expertd processes, real sockets.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <random>
#include <thread>

#include "daemon/fixture.h"
#include "proto/frame.h"

using namespace expertd;
using namespace expertd::test;

TEST_F(DaemonTest, HitsArePinnedFromTheBoardWithoutARoundTrip) {
  auto d = start({"--cache-slots", "16", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto c = client::Client::connect(socket(), {"board", 1000});
  ASSERT_TRUE(c) << c.error().message;
  use(**c, 1, {3, 9, 27});  // misses: through the socket
  // The daemon is stopped: a round trip would time out; the board answers alone.
  ASSERT_EQ(::kill(d->pid(), SIGSTOP), 0);
  auto l = (*c)->acquire(1, std::vector<uint32_t>{27, 3});
  const bool got = static_cast<bool>(l);
  const bool from_board = got && l->from_board;
  const bool bytes_ok = got && slot_matches_source(**c, *l, 0) && slot_matches_source(**c, *l, 1);
  const bool released = got && (*c)->release(*l);
  ::kill(d->pid(), SIGCONT);
  ASSERT_TRUE(got) << l.error().message;
  EXPECT_TRUE(from_board);
  EXPECT_TRUE(bytes_ok);
  EXPECT_TRUE(released);
  EXPECT_EQ(l->ready, (std::vector<uint8_t>{1, 1}));
  // A miss among them: the whole acquire goes through the socket, as before.
  auto m = (*c)->acquire(1, std::vector<uint32_t>{3, 4});
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_FALSE(m->from_board);
  ASSERT_TRUE((*c)->wait_ready(*m));
  ASSERT_TRUE((*c)->release(*m));
  // The board's acquire counts as the daemon's would: two hits, one acquire and release.
  EXPECT_EQ(stat(**c, "board_acquires"), 1);
  EXPECT_EQ(stat(**c, "acquires"), 3);
  EXPECT_EQ(stat(**c, "cache_hits"), 3);  // 27, 3, then 3 again
  EXPECT_EQ(stat(**c, "cache_misses"), 4);
  EXPECT_EQ(stat(**c, "releases"), 3);
  EXPECT_EQ(stat(**c, "board_ring_lost"), 0);
}

TEST_F(DaemonTest, ASlotPinnedFromTheBoardIsNeverEvicted) {
  auto d = start({"--cache-slots", "8", "--policy", "lru", "--clients-max", "2",
                  "--max-experts-per-request", "4"});
  auto a = connect(), b = connect();
  use(*a, 0, {0, 1, 2, 3});
  auto held = a->acquire(0, std::vector<uint32_t>{0, 1, 2, 3});
  ASSERT_TRUE(held);
  ASSERT_TRUE(held->from_board);
  // b cycles through every expert of layer 1: LRU would evict layer 0's four first.
  for (uint32_t e = 0; e < kExperts; e += 4) use(*b, 1, {e, e + 1, e + 2, e + 3});
  EXPECT_GE(stat(*b, "cache_evictions"), 24);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_matches_source(*a, *held, i)) << i;
  EXPECT_EQ(stat(*b, "slots_pinned"), 4);
  ASSERT_TRUE(a->release(*held));
  EXPECT_EQ(stat(*b, "slots_pinned"), 0);
  for (uint32_t e = 4; e < 12; e += 4) use(*b, 1, {e, e + 1, e + 2, e + 3});
  // Now they may go: nothing of layer 0 is on the board any more.
  auto again = a->acquire(0, std::vector<uint32_t>{0, 1, 2, 3});
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->from_board);
  ASSERT_TRUE(a->wait_ready(*again));
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_matches_source(*a, *again, i)) << i;
  ASSERT_TRUE(a->release(*again));
}

// Two engines race the daemon's evictions on a cache of exactly their pin budgets: every slot
// either hands out holds the expert asked for, for as long as it is held.
TEST_F(DaemonTest, BoardPinsRacingEvictionsNeverSeeAReusedSlot) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4",
                  "--policy", "lru"});
  std::atomic<int> wrong{0}, board{0}, total{0};
  auto engine = [&](uint64_t seed) {
    auto c = connect();
    ASSERT_TRUE(c);
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 400; ++i) {
      const uint32_t layer = rng() % kLayers;
      std::vector<uint32_t> ids;
      const size_t n = 1 + rng() % 4;
      while (ids.size() < n) {
        const uint32_t e = rng() % 6;  // a small working set: many hits, many evictions
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
      }
      auto l = c->acquire(layer, ids);
      ASSERT_TRUE(l) << l.error().message;
      ASSERT_TRUE(c->wait_ready(*l));
      board += l->from_board;
      ++total;
      for (int pass = 0; pass < 2; ++pass) {  // at once, and after the other engine had a go
        for (size_t k = 0; k < ids.size(); ++k) wrong += !slot_matches_source(*c, *l, k);
        std::this_thread::yield();
      }
      ASSERT_TRUE(c->release(*l));
    }
  };
  std::thread t1(engine, 1), t2(engine, 2);
  t1.join(), t2.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(board.load(), 0);
  EXPECT_LT(board.load(), total.load());  // and misses through the socket, with evictions
  auto c = connect();
  EXPECT_EQ(stat(*c, "board_acquires"), board.load());
  EXPECT_EQ(stat(*c, "acquires"), total.load());
  EXPECT_GT(stat(*c, "cache_evictions"), 0);
  EXPECT_EQ(stat(*c, "checksum_errors"), 0);
}

TEST_F(DaemonTest, AGoneEnginesBoardPinsAreDropped) {
  auto d = start({"--cache-slots", "8", "--clients-max", "2", "--max-experts-per-request", "4"});
  auto a = connect(), b = connect();
  use(*a, 0, {0, 1, 2, 3});
  auto held = a->acquire(0, std::vector<uint32_t>{0, 1, 2, 3});
  ASSERT_TRUE(held && held->from_board);
  EXPECT_EQ(stat(*b, "slots_pinned"), 4);
  a.reset();  // gone without a release
  for (int i = 0; i < 200 && stat(*b, "clients") > 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stat(*b, "slots_pinned"), 0);
  ASSERT_TRUE(b->admin(client::AdminOp::EvictAll));
  EXPECT_EQ(stat(*b, "slots_used"), 0);
  EXPECT_EQ(stat(*b, "board_acquires"), 1);  // its board acquire still counted
}

TEST_F(DaemonTest, WithoutTheBoardEveryAcquireIsARoundTrip) {
  for (bool daemon_side : {true, false}) {
    auto d =
        start(daemon_side ? std::vector<std::string>{"--cache-slots", "8", "--clients-max", "1",
                                                     "--residency-board", "false"}
                          : std::vector<std::string>{"--cache-slots", "8", "--clients-max", "1"});
    client::Client::Options o{"no-board", 20000};
    o.use_board = daemon_side;  // off on one side or the other
    auto c = client::Client::connect(socket(), o);
    ASSERT_TRUE(c) << c.error().message;
    use(**c, 0, {1, 2});
    auto l = (*c)->acquire(0, std::vector<uint32_t>{1, 2});
    ASSERT_TRUE(l);
    EXPECT_FALSE(l->from_board);
    EXPECT_EQ(l->ready, (std::vector<uint8_t>{1, 1}));
    ASSERT_TRUE((*c)->release(*l));
    EXPECT_EQ(stat(**c, "board_acquires"), 0);
    EXPECT_EQ(stat(**c, "cache_hits"), 2);
    c->reset();
    EXPECT_EQ(d->stop(), 0);
  }
}

TEST_F(DaemonTest, AnOldProtocolClientGetsAClearError) {
  auto d = start({"--cache-slots", "8", "--clients-max", "1", "--max-experts-per-request", "4"});
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", socket().c_str());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  flatbuffers::FlatBufferBuilder fbb;
  ASSERT_TRUE(
      proto::send_all(fd, proto::make_frame(fbb, 1, wire::CreateHelloDirect(fbb, 1, "old"))));
  std::vector<uint8_t> body;
  ASSERT_TRUE(proto::recv_frame(fd, body, 1 << 20));
  auto env = proto::verify_envelope(body);
  ASSERT_TRUE(env);
  const auto* e = (*env)->msg_as_Error();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code(), wire::ErrorCode::VersionMismatch);
  EXPECT_EQ(e->message()->str(), "protocol version 1 is not supported (expertd speaks 2)");
  ::close(fd);
  EXPECT_TRUE(d->alive());
}

// A layer's whole expert set in one acquire, more than the pin budget: the first wave is what
// is resident (then misses) up to the budget, every miss of the layer is read at once, and each
// done() brings the next wave's slots with their Ready. Never more than the budget pinned.
TEST_F(DaemonTest, ALayerLargerThanThePinBudgetComesInWaves) {
  auto d = start({"--cache-slots", "12", "--clients-max", "1", "--max-experts-per-request", "4",
                  "--policy", "lru"});
  auto c = connect();
  use(*c, 0, {7, 8});
  const std::vector<uint32_t> layer = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto l = c->acquire(0, layer);
  ASSERT_TRUE(l) << l.error().message;
  EXPECT_FALSE(l->from_board);
  // Wave one: the resident 7 and 8, then the first misses 0 and 1.
  size_t granted = 0;
  for (size_t i = 0; i < layer.size(); ++i) granted += l->granted(i);
  EXPECT_EQ(granted, 4u);
  EXPECT_TRUE(l->granted(7) && l->granted(8) && l->granted(0) && l->granted(1));
  EXPECT_EQ(l->ready[7] + l->ready[8], 2);
  // Every miss (0-6, 9) is read at once, not wave by wave.
  for (int i = 0; i < 400 && stat(*c, "pack_reads") < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stat(*c, "pack_reads"), 10);
  EXPECT_EQ(stat(*c, "slots_pinned"), 4);
  // Waiting for all of it without handing anything back is an error, not a hang.
  auto stuck = c->wait_ready(*l);
  ASSERT_FALSE(stuck);
  EXPECT_NE(stuck.error().message.find("done()"), std::string::npos) << stuck.error().message;
  std::vector<size_t> seen;
  for (size_t i = 0; i < layer.size(); ++i)
    if (l->ready[i]) seen.push_back(i);
  while (seen.size() < layer.size()) {
    std::vector<size_t> used;
    for (size_t i : seen)
      if (!l->done[i]) used.push_back(i);
    for (size_t i : used) EXPECT_TRUE(slot_matches_source(*c, *l, i)) << "expert " << layer[i];
    ASSERT_TRUE(c->done(*l, used));
    auto loading = [&] {
      for (size_t i = 0; i < layer.size(); ++i)
        if (l->granted(i) && !l->ready[i]) return true;
      return false;
    };
    do {  // this wave's Ready messages, each with its slot
      auto next = c->next_ready(*l);
      ASSERT_TRUE(next) << next.error().message;
      ASSERT_TRUE(next->has_value()) << [&] {
        std::string t;
        for (size_t i = 0; i < layer.size(); ++i)
          t += std::to_string(i) + ":" + std::to_string(l->slots[i]) + "/" +
               std::to_string(l->ready[i]) + "/" + std::to_string(l->done[i]) + " ";
        return t;
      }();
      seen.push_back(**next);
      ASSERT_TRUE(l->granted(**next));
    } while (loading());
    EXPECT_LE(stat(*c, "slots_pinned"), 4);
  }
  for (size_t i = 0; i < layer.size(); ++i) {
    if (!l->done[i]) {
      EXPECT_TRUE(slot_matches_source(*c, *l, i)) << "expert " << layer[i];
    }
  }
  ASSERT_TRUE(c->release(*l));
  EXPECT_EQ(stat(*c, "slots_pinned"), 0);
  EXPECT_EQ(stat(*c, "pack_reads"), 10);
  EXPECT_EQ(stat(*c, "waves"), 1);
  EXPECT_EQ(stat(*c, "cache_hits"), 2);     // 7 and 8
  EXPECT_EQ(stat(*c, "cache_misses"), 10);  // 7, 8 the first time, then 0-6 and 9
  EXPECT_EQ(stat(*c, "io_errors"), 0);
}
