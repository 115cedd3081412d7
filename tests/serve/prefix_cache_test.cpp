// The prefix cache's two tiers with real parts: the RAM tier's index (longest prefix, cuts only
// where states cut, least recently used out first) and the SSD tier on real O_DIRECT files
// (found again after a restart, a damaged or truncated file a counted miss and never a state,
// another model's files left alone, the budget kept).
#include "serve/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "serve/prefix_disk.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::serve;

namespace {

std::vector<int32_t> toks(size_t n, int32_t seed) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + size_t(seed)) % 4096);
  return t;
}

engine::SeqState state_of(const std::vector<int32_t>& t, size_t floats) {
  engine::SeqState s;
  s.n_past = int(t.size());
  std::vector<float> f(floats);
  for (size_t i = 0; i < floats; ++i) f[i] = float(i) * 0.5f + float(t.size());
  const auto* b = reinterpret_cast<const uint8_t*>(f.data());
  s.data.assign(b, b + floats * sizeof(float));
  return s;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(PrefixCache, FindsTheLongestPrefixAndCutsOnlyWhereStatesCut) {
  const auto a = toks(200, 1), more = toks(100, 2);
  for (bool cut : {true, false}) {
    SCOPED_TRACE(cut ? "cuttable" : "checkpoints only");
    PrefixCache pc(1 << 20, cut);
    pc.put(a, state_of(a, 100));
    // The same prompt plus more: the whole entry.
    auto h = pc.find(concat(a, more));
    EXPECT_EQ(h.n, 200);
    ASSERT_TRUE(h.state);
    EXPECT_EQ(h.state->n_past, 200);
    // A prompt diverging at 150: cut at 150, or (checkpoints) nothing.
    auto diverging = a;
    diverging[150] = 4095 - diverging[150];
    EXPECT_EQ(pc.find(diverging).n, cut ? 150 : 0);
    // The same prompt again: its last token must still be evaluated.
    EXPECT_EQ(pc.find(a).n, cut ? 199 : 0);
    // Too short to be kept or found.
    pc.put(toks(10, 3), state_of(toks(10, 3), 10));
    EXPECT_EQ(pc.entries(), 1u);
  }
}

TEST(PrefixCache, ACheckpointShorterThanTheDeepestMatchIsStillFound) {
  PrefixCache pc(1 << 20, /*can_cut=*/false);
  const auto a = toks(150, 1), b = concat(a, toks(300, 2));
  pc.put(a, state_of(a, 10));
  pc.put(b, state_of(b, 10));
  auto p = b;
  p[400] ^= 1;  // shares 400 tokens with b (not whole) and all of a
  EXPECT_EQ(pc.find(p).n, 150);
}

TEST(PrefixCache, LeastRecentlyUsedGoesFirstWithinTheBudget) {
  const size_t per = 1000 * sizeof(float);
  PrefixCache pc(3 * per, true);
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 3; ++i) {
    p.push_back(toks(100, 10 * i + 1));
    pc.put(p.back(), state_of(p.back(), 1000));
  }
  EXPECT_EQ(pc.find(concat(p[0], {1})).n, 100);  // p[0] is now the most recent
  p.push_back(toks(100, 99));
  pc.put(p.back(), state_of(p.back(), 1000));
  EXPECT_EQ(pc.entries(), 3u);
  EXPECT_EQ(pc.evictions(), 1u);
  EXPECT_LE(pc.bytes(), 3 * per);
  EXPECT_EQ(pc.find(concat(p[1], {1})).n, 0);  // the least recently used went
  EXPECT_EQ(pc.find(concat(p[0], {1})).n, 100);
}

// KV events: a block is stored when the first entry holding its prefix arrives (the run of new
// blocks, its parent the block before, its tokens), removed when the last one leaves; a longer
// entry replacing a shorter one removes nothing it keeps.
TEST(PrefixCache, BlockEventsFollowTheIndex) {
  const size_t per = 1000 * sizeof(float);
  PrefixCache pc(2 * per, true);
  pc.track_events(true);
  const auto a = toks(200, 1), a2 = concat(a, toks(100, 2));  // 3 blocks, then 4
  pc.put(a, state_of(a, 1000));
  auto ev = pc.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, BlockEvent::Stored);
  ASSERT_EQ(ev[0].hashes.size(), 3u);
  EXPECT_FALSE(ev[0].has_parent);
  EXPECT_EQ(ev[0].tokens, std::vector<int32_t>(a.begin(), a.begin() + 192));
  const auto first = ev[0].hashes;
  pc.put(a2, state_of(a2, 1000));  // a is dropped (covered): its blocks stay held by a2
  ev = pc.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, BlockEvent::Stored);
  ASSERT_EQ(ev[0].hashes.size(), 1u);
  EXPECT_TRUE(ev[0].has_parent);
  EXPECT_EQ(ev[0].parent, first.back());
  EXPECT_EQ(ev[0].tokens, std::vector<int32_t>(a2.begin() + 192, a2.begin() + 256));
  EXPECT_EQ(pc.take_events().size(), 0u);
  // Two more prompts in a budget of two: a2 is evicted, its 4 blocks removed.
  const auto b = toks(128, 5), c = toks(64, 6);
  pc.put(b, state_of(b, 1000));
  pc.put(c, state_of(c, 1000));
  ev = pc.take_events();
  ASSERT_EQ(ev.size(), 3u);  // b stored; then a2 removed, c stored
  EXPECT_EQ(ev[0].kind, BlockEvent::Stored);
  EXPECT_EQ(ev[1].kind, BlockEvent::Removed);
  const auto& removed = ev[1].hashes;
  EXPECT_EQ(removed.size(), 4u);
  for (uint64_t h : first) EXPECT_NE(std::find(removed.begin(), removed.end(), h), removed.end());
  EXPECT_EQ(ev[2].kind, BlockEvent::Stored);
  EXPECT_EQ(ev[2].hashes.size(), 1u);
  // Untracked: nothing collects.
  PrefixCache quiet(1 << 20, true);
  quiet.put(a, state_of(a, 10));
  EXPECT_TRUE(quiet.take_events().empty());
}

// vLLM's msgspec array_like encoding, byte for byte (msgpack spec: fixarray 0x9N, fixstr 0xaN,
// float64 0xcb, uint8 0xcc, uint64 0xcf, nil 0xc0).
TEST(KvEvents, ABatchIsVllmsMsgpack) {
  std::vector<BlockEvent> ev(3);
  ev[0] = {BlockEvent::Stored, {0x0102030405060708ull}, true, 5, {1, 200}};
  ev[1] = {BlockEvent::Removed, {7}, false, 0, {}};
  ev[2] = {BlockEvent::Cleared, {}, false, 0, {}};
  const std::string got = encode_kv_event_batch(1.5, ev, 64);
  std::string want("\x92\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x93", 11);
  want +=
      "\x96\xab"
      "BlockStored"
      "\x91\xcf\x01\x02\x03\x04\x05\x06\x07\x08\x05\x92\x01\xcc\xc8\x40\xc0";
  want +=
      "\x92\xac"
      "BlockRemoved"
      "\x91\x07";
  want +=
      "\x91\xb0"
      "AllBlocksCleared";
  EXPECT_EQ(got, want);
}

TEST(PrefixDisk, StatesSurviveARestartAndDamageIsAMissNeverAState) {
  test::TempDir dir;
  const auto a = toks(300, 5), b = toks(500, 6);
  {
    auto d = PrefixDisk::open(dir.path(), 1 << 30, 42);
    ASSERT_TRUE(d) << d.error().message;
    (*d)->write(a, state_of(a, 5000));
    (*d)->write(b, state_of(b, 7000));
    (*d)->write(a, state_of(a, 5000));  // already there: not written twice
    (*d)->flush();
    EXPECT_EQ((*d)->counters().writes, 2u);
  }
  auto d = PrefixDisk::open(dir.path(), 1 << 30, 42);  // a restart
  ASSERT_TRUE(d);
  EXPECT_EQ((*d)->entries(), 2u);
  int n = 0;
  auto e = (*d)->find(concat(a, toks(10, 7)), true, n);
  ASSERT_TRUE(e);
  EXPECT_EQ(n, 300);
  auto s = (*d)->read(*e);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->n_past, 300);
  EXPECT_EQ(s->data, state_of(a, 5000).data);
  // One flipped byte in the state: a miss, counted, the file gone.
  {
    std::fstream f(e->file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 300 * 4 + 1000);
    f.put('\x7f');
  }
  EXPECT_FALSE((*d)->read(*e));
  EXPECT_EQ((*d)->counters().damaged, 1u);
  EXPECT_FALSE(std::filesystem::exists(e->file));
  EXPECT_FALSE((*d)->find(concat(a, toks(10, 7)), true, n));
  // A truncated file: found damaged when the directory is read again.
  auto eb = (*d)->find(concat(b, toks(10, 7)), true, n);
  ASSERT_TRUE(eb);
  std::filesystem::resize_file(eb->file, 4096 * 2);
  auto d2 = PrefixDisk::open(dir.path(), 1 << 30, 42);
  ASSERT_TRUE(d2);
  EXPECT_EQ((*d2)->entries(), 0u);
  EXPECT_EQ((*d2)->counters().damaged, 1u);
}

TEST(PrefixDisk, AnotherModelsFilesAreLeftAloneAndTheBudgetIsKept) {
  test::TempDir dir;
  const auto a = toks(300, 5);
  {
    auto other = PrefixDisk::open(dir.path(), 1 << 30, 7);
    ASSERT_TRUE(other);
    (*other)->write(a, state_of(a, 5000));
    (*other)->flush();
  }
  // Each file: a 4096-byte header, then tokens and state padded to 4096.
  const uint64_t file = 4096 + (300 * 4 + 5000 * 4 + 4095) / 4096 * 4096;
  auto d = PrefixDisk::open(dir.path(), 2 * file, 42);
  ASSERT_TRUE(d);
  int n = 0;
  EXPECT_FALSE((*d)->find(concat(a, {1}), true, n));  // model 7's state is not model 42's
  for (int i = 0; i < 3; ++i) {
    const auto t = toks(300, 100 + i);
    (*d)->write(t, state_of(t, 5000));
    (*d)->flush();
  }
  EXPECT_EQ((*d)->entries(), 2u);
  EXPECT_LE((*d)->bytes(), 2 * file);
  EXPECT_EQ((*d)->counters().evictions, 1u);
  size_t files = 0;
  for (auto& p : std::filesystem::directory_iterator(dir.path()))
    files += p.path().extension() == ".pfx";
  EXPECT_EQ(files, 3u);  // model 7's file and this model's two
}

TEST(PrefixDisk, ADirectoryThatCannotBeMadeIsAClearError) {
  auto d = PrefixDisk::open("/proc/no-such/dir", 1 << 20, 1);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("--prefix-cache-dir"), std::string::npos);
}
