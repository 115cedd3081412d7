// The daemon's side of the residency board (proto/board.h): publishes what each slot holds ready,
// withdraws a slot before it is reused unless an engine pinned it from the board, and drains the
// rings of experts engines took that way. Control thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/fd.h"
#include "common/result.h"

namespace expertd::daemon {

class Board {
 public:
  static Result<std::unique_ptr<Board>> create(uint32_t n_keys, uint32_t slot_count,
                                               uint32_t places, uint32_t pins_per_place);
  ~Board();

  int board_fd() const { return board_fd_.get(); }  // sealed: clients map it read-only
  int pins_fd() const { return pins_fd_.get(); }
  uint64_t board_bytes() const { return board_bytes_; }
  uint64_t pins_bytes() const { return pins_bytes_; }
  uint32_t places() const { return places_; }
  uint32_t pins_per_place() const { return pins_per_place_; }

  // The slot holds `key` ready: engines may pin it from now on.
  void publish(uint32_t slot, uint32_t key);
  // Before the slot is reused: false (and the slot stays published) when an engine holds a pin on
  // it; then it must not be evicted.
  bool withdraw(uint32_t slot);
  // Slots engines hold pins on now (a slot once per pin).
  void pinned_slots(std::vector<uint32_t>& out) const;
  // A place freed (its engine disconnected): its pins dropped, its ring emptied.
  void clear_place(uint32_t place);
  // Calls fn(layer, experts) for each acquire an engine served from the board since the last
  // drain. Returns the ring words lost to an engine that wrote past the daemon's tail (a client
  // bug; counted, never trusted).
  uint64_t drain(uint32_t place,
                 const std::function<void(uint32_t, std::span<const uint32_t>)>& fn);

 private:
  Board() = default;
  UniqueFd board_fd_, pins_fd_;
  uint8_t* board_ = nullptr;
  uint8_t* pins_ = nullptr;
  uint64_t board_bytes_ = 0, pins_bytes_ = 0;
  uint32_t n_keys_ = 0, slot_count_ = 0, places_ = 0, pins_per_place_ = 0;
  std::vector<uint32_t> epoch_;  // per slot
  std::vector<uint32_t> key_;    // per slot: the key published, or ~0u
};

}  // namespace expertd::daemon
