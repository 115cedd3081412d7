// Framing: u32 little-endian length + one flatbuffers Envelope, bounded and verified.
// Also blocking send/receive helpers for clients (the daemon reads frames through Asio).
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "proto/expertd_generated.h"

namespace expertd::proto {

// 2: the residency board (HelloReply's board_bytes, pins_bytes, pin_place and two descriptors);
//    an acquire of a whole layer granted in waves (Ready.slot, Done).
//    ExpertsRequest/ExpertsReply came later at the union's end, without a bump: a daemon older
//    than them answers BadRequest ("message type not accepted"), nothing else changes.
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr size_t kPassFdsMax = 4;          // descriptors one frame may carry
inline constexpr uint32_t kNoSlot = 0xffffffffu;  // an expert of a lease not granted yet
inline constexpr uint32_t kFrameBytesMaxDefault = 1u << 20;
inline constexpr uint32_t kFrameHeaderBytes = 4;

// Verifies a frame body; the returned pointer aliases `body`.
Result<const wire::Envelope*> verify_envelope(std::span<const uint8_t> body);

// A finished builder as a frame: length prefix + buffer.
std::vector<uint8_t> to_frame(flatbuffers::FlatBufferBuilder& fbb);

// Convenience: an Envelope carrying `msg` of union type `type`, finished and framed.
template <class T>
std::vector<uint8_t> make_frame(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                flatbuffers::Offset<T> msg) {
  auto env = wire::CreateEnvelope(fbb, request_id, wire::MessageTraits<T>::enum_value, msg.Union());
  fbb.Finish(env);
  return to_frame(fbb);
}

std::vector<uint8_t> make_error_frame(uint64_t request_id, wire::ErrorCode code,
                                      const std::string& message);

// Blocking I/O on a stream socket. send_all may pass file descriptors (SCM_RIGHTS) with the
// first bytes.
Status send_all(int fd, std::span<const uint8_t> bytes, std::span<const int> fds = {});
// One non-blocking sendmsg (the daemon's write queue): the bytes sent (0 when the socket buffer
// is full), fds riding on the first of them.
Result<size_t> send_some(int fd, std::span<const uint8_t> bytes, std::span<const int> fds);
// Reads one frame into `body` (resized); appends passed descriptors to *got_fds when given
// (closes them otherwise).
Status recv_frame(int fd, std::vector<uint8_t>& body, uint32_t frame_bytes_max,
                  std::vector<int>* got_fds = nullptr);

}  // namespace expertd::proto
