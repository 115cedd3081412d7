#include "serve/kv_events.h"

#include <bit>
#include <chrono>
#include <cstring>

#ifdef EXPERTD_HAVE_ZMQ
#include <zmq.h>
#endif

namespace expertd::serve {

namespace {

// The few msgpack forms a batch needs (https://github.com/msgpack/msgpack/blob/master/spec.md).
struct Pack {
  std::string out;
  void be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out.push_back(char((v >> (8 * i)) & 0xff));
  }
  void array(size_t n) {
    if (n <= 15) {
      out.push_back(char(0x90 | n));
    } else if (n <= 0xffff) {
      out.push_back(char(0xdc));
      be(n, 2);
    } else {
      out.push_back(char(0xdd));
      be(n, 4);
    }
  }
  void uint(uint64_t v) {
    if (v <= 0x7f) {
      out.push_back(char(v));
    } else if (v <= 0xff) {
      out.push_back(char(0xcc));
      be(v, 1);
    } else if (v <= 0xffff) {
      out.push_back(char(0xcd));
      be(v, 2);
    } else if (v <= 0xffffffff) {
      out.push_back(char(0xce));
      be(v, 4);
    } else {
      out.push_back(char(0xcf));
      be(v, 8);
    }
  }
  void nil() { out.push_back(char(0xc0)); }
  void f64(double d) {
    out.push_back(char(0xcb));
    be(std::bit_cast<uint64_t>(d), 8);
  }
  void str(const char* s) {
    const size_t n = std::strlen(s);
    if (n <= 31) {
      out.push_back(char(0xa0 | n));
    } else {
      out.push_back(char(0xd9));
      be(n, 1);
    }
    out.append(s, n);
  }
};

}  // namespace

std::string encode_kv_event_batch(double ts, const std::vector<BlockEvent>& events,
                                  uint32_t block_size) {
  Pack p;
  p.array(2);  // data_parallel_rank omitted: vLLM leaves out a None (omit_defaults)
  p.f64(ts);
  p.array(events.size());
  for (const BlockEvent& e : events) {
    switch (e.kind) {
      case BlockEvent::Stored:
        p.array(6);
        p.str("BlockStored");
        p.array(e.hashes.size());
        for (uint64_t h : e.hashes) p.uint(h);
        if (e.has_parent)
          p.uint(e.parent);
        else
          p.nil();
        p.array(e.tokens.size());
        for (int32_t t : e.tokens) p.uint(uint64_t(uint32_t(t)));  // token ids are >= 0
        p.uint(block_size);
        p.nil();  // lora_id
        break;
      case BlockEvent::Removed:
        p.array(2);
        p.str("BlockRemoved");
        p.array(e.hashes.size());
        for (uint64_t h : e.hashes) p.uint(h);
        break;
      case BlockEvent::Cleared:
        p.array(1);
        p.str("AllBlocksCleared");
        break;
    }
  }
  return std::move(p.out);
}

#ifdef EXPERTD_HAVE_ZMQ

KvEvents::KvEvents(void* ctx, void* sock, std::string topic, uint32_t block_size)
    : ctx_(ctx), sock_(sock), topic_(std::move(topic)), block_size_(block_size) {}

Result<std::unique_ptr<KvEvents>> KvEvents::open(const std::string& endpoint,
                                                 const std::string& topic, uint32_t block_size) {
  void* ctx = zmq_ctx_new();
  if (!ctx)
    return make_error(std::string("--kv-events-endpoint: zmq_ctx_new: ") +
                      zmq_strerror(zmq_errno()));
  void* sock = zmq_socket(ctx, ZMQ_PUB);
  auto fail = [&](const std::string& what) -> Result<std::unique_ptr<KvEvents>> {
    const std::string msg =
        "--kv-events-endpoint " + endpoint + ": " + what + ": " + zmq_strerror(zmq_errno());
    if (sock) zmq_close(sock);
    zmq_ctx_term(ctx);
    return make_error(msg);
  };
  if (!sock) return fail("zmq_socket");
  const int hwm = 100000, linger_ms = 1000;  // vLLM's default high-water mark
  zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  zmq_setsockopt(sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  const bool bind = endpoint.find('*') != std::string::npos ||
                    endpoint.find("::") != std::string::npos || endpoint.starts_with("ipc://") ||
                    endpoint.starts_with("inproc://");
  if ((bind ? zmq_bind(sock, endpoint.c_str()) : zmq_connect(sock, endpoint.c_str())) != 0)
    return fail(bind ? "cannot bind" : "cannot connect");
  return std::unique_ptr<KvEvents>(new KvEvents(ctx, sock, topic, block_size));
}

KvEvents::~KvEvents() {
  zmq_close(sock_);
  zmq_ctx_term(ctx_);  // waits up to the linger for what is queued
}

void KvEvents::publish(const std::vector<BlockEvent>& events) {
  if (events.empty()) return;
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string payload = encode_kv_event_batch(ts, events, block_size_);
  std::lock_guard lk(mu_);
  char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = char((seq_ >> (8 * (7 - i))) & 0xff);
  ++seq_;
  // A PUB socket never blocks: past the high-water mark the batch is dropped.
  zmq_send(sock_, topic_.data(), topic_.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(sock_, seq, sizeof seq, ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(sock_, payload.data(), payload.size(), ZMQ_DONTWAIT);
}

#else

KvEvents::KvEvents(void* ctx, void* sock, std::string topic, uint32_t block_size)
    : ctx_(ctx), sock_(sock), topic_(std::move(topic)), block_size_(block_size) {}

Result<std::unique_ptr<KvEvents>> KvEvents::open(const std::string&, const std::string&, uint32_t) {
  return make_error(
      "--kv-events-endpoint: this expert-serve was built without libzmq (install libzmq3-dev, "
      "or run scripts/install-deps.sh, and rebuild)");
}

KvEvents::~KvEvents() = default;

void KvEvents::publish(const std::vector<BlockEvent>&) {}

#endif

uint64_t KvEvents::batches() const {
  std::lock_guard lk(mu_);
  return seq_;
}

}  // namespace expertd::serve
