#include "daemon/board.h"

#include <sys/mman.h>

#include <cstring>

#include "proto/board.h"

namespace expertd::daemon {

namespace b = proto::board;

namespace {
Result<std::pair<UniqueFd, uint8_t*>> shared_memory(const char* name, uint64_t bytes) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_error(std::string("memfd_create ") + name);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0)
    return errno_error(std::string("size the ") + name + " memfd");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return errno_error(std::string("map the ") + name);
  return std::pair{std::move(fd), static_cast<uint8_t*>(p)};
}
}  // namespace

Result<std::unique_ptr<Board>> Board::create(uint32_t n_keys, uint32_t slot_count, uint32_t places,
                                             uint32_t pins_per_place) {
  std::unique_ptr<Board> bd(new Board());
  bd->n_keys_ = n_keys, bd->slot_count_ = slot_count;
  bd->places_ = places, bd->pins_per_place_ = pins_per_place;
  bd->board_bytes_ = b::board_bytes(n_keys, slot_count);
  bd->pins_bytes_ = b::pins_bytes(places, pins_per_place);
  auto board = shared_memory("expertd-board", bd->board_bytes_);
  if (!board) return board.error();
  bd->board_fd_ = std::move(board->first);
  bd->board_ = board->second;
  auto pins = shared_memory("expertd-pins", bd->pins_bytes_);
  if (!pins) return pins.error();
  bd->pins_fd_ = std::move(pins->first);
  bd->pins_ = pins->second;
  b::Header h{b::kMagic, n_keys, slot_count, places, pins_per_place};
  std::memcpy(bd->board_, &h, sizeof h);
  // Clients map the board read-only and nothing else; its size never changes.
  if (::fcntl(bd->board_fd_.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
    return errno_error("seal the board memfd");
  if (::fcntl(bd->pins_fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return errno_error("seal the pins memfd");
  bd->epoch_.assign(slot_count, 0);
  bd->key_.assign(slot_count, ~0u);
  return bd;
}

Board::~Board() {
  if (board_) ::munmap(board_, board_bytes_);
  if (pins_) ::munmap(pins_, pins_bytes_);
}

void Board::publish(uint32_t slot, uint32_t key) {
  key_[slot] = key;
  b::at<uint64_t>(board_, b::word_offset(n_keys_) + size_t{slot} * 8)
      .store(b::word(++epoch_[slot], key + 1), std::memory_order_seq_cst);
  b::at<uint32_t>(board_, b::slot_of_offset() + size_t{key} * 4)
      .store(slot + 1, std::memory_order_release);
}

bool Board::withdraw(uint32_t slot) {
  const uint32_t key = key_[slot];
  if (key == ~0u) return true;  // never published (a read that failed)
  auto w = b::at<uint64_t>(board_, b::word_offset(n_keys_) + size_t{slot} * 8);
  w.store(b::word(++epoch_[slot], 0), std::memory_order_seq_cst);
  for (uint32_t p = 0; p < places_; ++p) {
    const size_t base = size_t{p} * b::place_bytes(pins_per_place_) + b::pins_offset();
    for (uint32_t i = 0; i < pins_per_place_; ++i)
      if (b::at<uint32_t>(pins_, base + size_t{i} * 4).load(std::memory_order_seq_cst) ==
          slot + 1) {
        // Pinned between the engine's two reads of the word: it stays (a new epoch: an engine
        // that read the withdrawn word backs off and acquires through the socket).
        w.store(b::word(++epoch_[slot], key + 1), std::memory_order_seq_cst);
        return false;
      }
  }
  b::at<uint32_t>(board_, b::slot_of_offset() + size_t{key} * 4)
      .store(0, std::memory_order_release);
  key_[slot] = ~0u;
  return true;
}

void Board::pinned_slots(std::vector<uint32_t>& out) const {
  out.clear();
  for (uint32_t p = 0; p < places_; ++p) {
    const size_t base = size_t{p} * b::place_bytes(pins_per_place_) + b::pins_offset();
    for (uint32_t i = 0; i < pins_per_place_; ++i)
      if (uint32_t v = b::at<uint32_t>(pins_, base + size_t{i} * 4).load(std::memory_order_acquire);
          v != 0 && v <= slot_count_)
        out.push_back(v - 1);
  }
}

void Board::clear_place(uint32_t place) {
  const size_t base = size_t{place} * b::place_bytes(pins_per_place_);
  for (uint32_t i = 0; i < pins_per_place_; ++i)
    b::at<uint32_t>(pins_, base + b::pins_offset() + size_t{i} * 4)
        .store(0, std::memory_order_release);
  // The next engine in this place starts with an empty ring (head = tail).
  const uint64_t head = b::at<uint64_t>(pins_, base).load(std::memory_order_acquire);
  b::at<uint64_t>(pins_, base + 8).store(head, std::memory_order_release);
}

uint64_t Board::drain(uint32_t place,
                      const std::function<void(uint32_t, std::span<const uint32_t>)>& fn) {
  const size_t base = size_t{place} * b::place_bytes(pins_per_place_);
  auto tail_ref = b::at<uint64_t>(pins_, base + 8);
  const uint64_t head = b::at<uint64_t>(pins_, base).load(std::memory_order_acquire);
  uint64_t tail = tail_ref.load(std::memory_order_relaxed);
  if (head == tail) return 0;
  auto ring = [&](uint64_t pos) {
    return b::at<uint32_t>(pins_,
                           base + b::ring_offset(pins_per_place_) + size_t{pos % b::kRingWords} * 4)
        .load(std::memory_order_relaxed);
  };
  uint64_t lost = 0;
  if (head < tail || head - tail > b::kRingWords) {
    lost = head - tail;  // a ring written past its tail or rewound: nothing in it is trusted
    tail = head;
  }
  std::vector<uint32_t> experts;
  while (tail < head) {
    const uint32_t h = ring(tail);
    const uint32_t layer = h >> 16, n = h & 0xffff;
    if (n == 0 || n > pins_per_place_ || head - tail < 1 + uint64_t{n}) {
      lost += head - tail;
      tail = head;
      break;
    }
    experts.clear();
    for (uint32_t i = 0; i < n; ++i) experts.push_back(ring(tail + 1 + i));
    tail += 1 + n;
    fn(layer, experts);
  }
  tail_ref.store(tail, std::memory_order_release);
  return lost;
}

}  // namespace expertd::daemon
