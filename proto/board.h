// The residency board: how an engine finds and pins experts already in the cache without a round
// trip to expertd. Two memfds the daemon passes with HelloReply (SCM_RIGHTS), beside the arena's:
//
// - the board (sealed; read-only in clients): for each (pack layer, expert) the slot holding it
//   ready, and for each slot a word (epoch << 32 | key + 1) naming what it holds ready, 0 in the
//   low half while it holds nothing readable. The daemon changes a slot's word, with a new epoch,
//   before it reuses the slot, and publishes a new word only once the slot's bytes are in place
//   (after the checksum; on cuda after the copy's event).
// - the pins (read-write): one place per engine connection (HelloReply.pin_place) with
//   pins_per_place pin words (slot + 1, or 0) and a ring of the experts it took that way, which
//   the daemon drains into its hit counts, policy and trace as if they had been acquired.
//
// A fast pin is Dekker's handshake with the daemon's eviction: the engine writes its pin, then
// reads the slot's word again; the daemon writes the slot's new word, then reads every place's
// pins. With sequentially consistent order one of them sees the other: the engine backs off (and
// acquires through the socket) or the daemon keeps the slot (and evicts another).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace expertd::proto::board {

inline constexpr uint64_t kMagic = 0x3144524f42585045ull;  // "EPXBORD1"
// Per place. The daemon drains at each message and every 100 ms; an engine whose ring is full
// acquires through the socket (which drains it).
inline constexpr uint32_t kRingWords = 1u << 16;

struct Header {
  uint64_t magic;
  uint32_t n_keys;  // pack layers x experts
  uint32_t slot_count;
  uint32_t places;          // engine connections (--clients-max)
  uint32_t pins_per_place;  // max_experts_per_request
};

// The board: Header, then slot_of[n_keys] (u32: slot + 1, or 0), then word[slot_count] (u64).
inline size_t slot_of_offset() {
  return sizeof(Header);
}
inline size_t word_offset(uint32_t n_keys) {
  return (slot_of_offset() + size_t{n_keys} * 4 + 7) / 8 * 8;
}
inline size_t board_bytes(uint32_t n_keys, uint32_t slot_count) {
  return word_offset(n_keys) + size_t{slot_count} * 8;
}

// One place: head (u64, written by the engine: ring words written so far), tail (u64, written by
// the daemon: ring words drained), pin[pins_per_place] (u32), ring[kRingWords] (u32). A ring
// entry is (layer << 16 | n) followed by n expert ids: one acquire served from the board.
inline size_t pins_offset() {
  return 16;
}
inline size_t ring_offset(uint32_t pins_per_place) {
  return pins_offset() + size_t{pins_per_place} * 4;
}
inline size_t place_bytes(uint32_t pins_per_place) {
  return (ring_offset(pins_per_place) + size_t{kRingWords} * 4 + 63) / 64 * 64;
}
inline size_t pins_bytes(uint32_t places, uint32_t pins_per_place) {
  return size_t{places} * place_bytes(pins_per_place);
}

template <class T>
std::atomic_ref<T> at(const uint8_t* base, size_t offset) {
  return std::atomic_ref<T>(*reinterpret_cast<T*>(const_cast<uint8_t*>(base) + offset));
}

inline uint64_t word(uint32_t epoch, uint32_t key_plus_one) {
  return uint64_t{epoch} << 32 | key_plus_one;
}

}  // namespace expertd::proto::board
