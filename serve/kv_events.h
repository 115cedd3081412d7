// The prefix cache's block events in vLLM's KV-event format, for a router that tracks which
// worker holds which prompt prefix (llm-d's KV-cache indexer, anything that reads vLLM's
// events). One batch per change of the index, on a ZMQ PUB socket as three frames: the topic,
// the batch's sequence number (8 bytes, big-endian, from 0) and the batch, msgpack-encoded as
// vLLM's msgspec structs with array_like=True (vllm/distributed/kv_events.py):
//   batch            [ts (float64, seconds since the epoch), [event, ...]]
//   BlockStored      ["BlockStored", [block_hash, ...], parent_block_hash or nil,
//                     [token_id, ...], block_size, lora_id (nil)]
//   BlockRemoved     ["BlockRemoved", [block_hash, ...]]
//   AllBlocksCleared ["AllBlocksCleared"]
// A block is PrefixCache::kBlock tokens; its hash the index's chained xxh3 of the prefix up to
// its end (seeded with the previous block's hash, 0 for the first). Sending never blocks: a
// subscriber that falls behind the socket's high-water mark loses batches (the sequence numbers
// show the gap).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"

namespace expertd::serve {

struct BlockEvent {
  enum Kind { Stored, Removed, Cleared } kind = Stored;
  std::vector<uint64_t> hashes;
  bool has_parent = false;  // Stored: the block before the first (absent: they start the prompt)
  uint64_t parent = 0;
  std::vector<int32_t> tokens;  // Stored: the blocks' tokens, block_size each
};

// The msgpack bytes of one batch (tests, and the publisher).
std::string encode_kv_event_batch(double ts, const std::vector<BlockEvent>& events,
                                  uint32_t block_size);

class KvEvents {
 public:
  // endpoint as vLLM's --kv-events-config endpoint: bound where it has a wildcard ("tcp://*:5557")
  // or is ipc:// or inproc://, connected otherwise ("tcp://router:5557").
  static Result<std::unique_ptr<KvEvents>> open(const std::string& endpoint,
                                                const std::string& topic, uint32_t block_size);
  ~KvEvents();
  // One batch (nothing when `events` is empty).
  void publish(const std::vector<BlockEvent>& events);
  uint64_t batches() const;

 private:
  KvEvents(void* ctx, void* sock, std::string topic, uint32_t block_size);
  void* ctx_;
  void* sock_;
  const std::string topic_;
  const uint32_t block_size_;
  mutable std::mutex mu_;
  uint64_t seq_ = 0;
};

}  // namespace expertd::serve
