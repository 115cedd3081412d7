#include "proto/frame.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace expertd::proto {

Result<const wire::Envelope*> verify_envelope(std::span<const uint8_t> body) {
  flatbuffers::Verifier::Options opts;
  opts.max_depth = 16;
  opts.max_tables =
      1 << 16;  // a HelloReply holds a table per layer and role (frames are size-bounded)
  flatbuffers::Verifier v(body.data(), body.size(), opts);
  if (!wire::VerifyEnvelopeBuffer(v)) return make_error("frame is not a valid Envelope");
  const auto* env = wire::GetEnvelope(body.data());
  if (env->msg_type() == wire::Message::NONE || env->msg() == nullptr)
    return make_error("frame carries no message");
  return env;
}

std::vector<uint8_t> to_frame(flatbuffers::FlatBufferBuilder& fbb) {
  uint32_t n = fbb.GetSize();
  std::vector<uint8_t> out(kFrameHeaderBytes + n);
  uint8_t le[4] = {uint8_t(n), uint8_t(n >> 8), uint8_t(n >> 16), uint8_t(n >> 24)};
  std::memcpy(out.data(), le, 4);
  std::memcpy(out.data() + 4, fbb.GetBufferPointer(), n);
  return out;
}

std::vector<uint8_t> make_error_frame(uint64_t request_id, wire::ErrorCode code,
                                      const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb(256);
  auto err = wire::CreateErrorDirect(fbb, code, message.c_str());
  return make_frame(fbb, request_id, err);
}

namespace {
// One sendmsg's header over `bytes`, carrying `fds` (SCM_RIGHTS) when there are any.
struct SendMsg {
  iovec iov;
  msghdr msg{};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kPassFdsMax)];
  SendMsg(std::span<const uint8_t> bytes, std::span<const int> fds)
      : iov{const_cast<uint8_t*>(bytes.data()), bytes.size()} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fds.empty()) return;
    std::memset(ctrl, 0, sizeof ctrl);
    msg.msg_control = ctrl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  SendMsg(const SendMsg&) = delete;  // msg points into the object itself
  SendMsg& operator=(const SendMsg&) = delete;
};
}  // namespace

Status send_all(int fd, std::span<const uint8_t> bytes, std::span<const int> fds) {
  if (fds.size() > kPassFdsMax) return make_error("too many descriptors for one frame");
  size_t sent = 0;
  while (sent < bytes.size()) {
    SendMsg m(bytes.subspan(sent), sent == 0 ? fds : std::span<const int>());
    ssize_t n = ::sendmsg(fd, &m.msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET)
        return errno_error("expertd closed the connection (send)");
      return errno_error("send to expertd");
    }
    sent += static_cast<size_t>(n);
  }
  return {};
}

Result<size_t> send_some(int fd, std::span<const uint8_t> bytes, std::span<const int> fds) {
  if (fds.size() > kPassFdsMax) return make_error("too many descriptors for one frame");
  SendMsg m(bytes, fds);
  for (;;) {
    ssize_t n = ::sendmsg(fd, &m.msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return errno_error("send");
  }
}

namespace {
Status recv_exact(int fd, uint8_t* p, size_t bytes, std::vector<int>* got_fds) {
  size_t got = 0;
  while (got < bytes) {
    iovec iov{p + got, bytes - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kPassFdsMax)];
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return errno_error("expertd closed the connection (receive)");
      return errno_error("receive from expertd");
    }
    if (n == 0) return make_error("expertd closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int fdv;
          std::memcpy(&fdv, CMSG_DATA(c) + i * sizeof(int), sizeof fdv);
          if (got_fds)
            got_fds->push_back(fdv);
          else
            ::close(fdv);  // never leak a descriptor nobody asked for
        }
      }
    }
    got += static_cast<size_t>(n);
  }
  return {};
}
}  // namespace

Status recv_frame(int fd, std::vector<uint8_t>& body, uint32_t frame_bytes_max,
                  std::vector<int>* got_fds) {
  uint8_t h[4];
  EXPERTD_TRY(recv_exact(fd, h, 4, got_fds));
  uint32_t n = uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24;
  if (n == 0 || n > frame_bytes_max)
    return make_error("frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                      std::to_string(frame_bytes_max));
  body.resize(n);
  return recv_exact(fd, body.data(), n, got_fds);
}

}  // namespace expertd::proto
