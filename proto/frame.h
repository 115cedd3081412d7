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

inline constexpr uint32_t kProtocolVersion = 1;
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

// Blocking I/O on a stream socket. send_frame may pass one file descriptor (SCM_RIGHTS).
Status send_all(int fd, std::span<const uint8_t> bytes, int pass_fd = -1);
// One non-blocking sendmsg (the daemon's write queue): the bytes sent (0 when the socket buffer
// is full), pass_fd riding on the first of them.
Result<size_t> send_some(int fd, std::span<const uint8_t> bytes, int pass_fd);
// Reads one frame into `body` (resized); receives a passed fd into *got_fd when given.
Status recv_frame(int fd, std::vector<uint8_t>& body, uint32_t frame_bytes_max,
                  int* got_fd = nullptr);

}  // namespace expertd::proto
