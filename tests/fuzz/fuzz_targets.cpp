#include "fuzz/fuzz_targets.h"

#include <cstdlib>
#include <cstring>

#include "proto/frame.h"
#include "proto/pack_format.h"

namespace expertd::fuzz {
namespace {

// A small valid layout: 2 layers x 4 experts, gate/up/down Q8_0 rows of 256.
pack::Manifest small_manifest() {
  pack::Manifest m;
  m.pack_file = "m.expertpack";
  m.core_file = "m.core.gguf";
  m.model_id = 0x1234abcd5678ef00ull;
  m.arch = "qwen3moe";
  m.model_name = "fuzz";
  m.n_experts = 4;
  m.n_experts_used = 2;
  for (uint32_t l = 0; l < 2; ++l) {
    pack::LayerLayout L;
    L.model_layer = l;
    for (auto r : {pack::Role::Gate, pack::Role::Up, pack::Role::Down})
      L.roles.push_back({r, 8, {256, 64}, 0, 64 * 272, "blk." + std::to_string(l) + ".x"});
    L.checksums.assign(4, 42);
    m.layers.push_back(L);
  }
  pack::lay_out(m);
  return m;
}

std::string bytes(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

// What the daemon's handlers read of each request (daemon/server.cpp, daemon/cache.cpp): ids
// checked as Cache::check_ids checks them, against a 2-layer, 4-expert pack.
void read_message(const wire::Envelope* e) {
  auto ids = [](const flatbuffers::Vector<uint32_t>* v) {
    uint64_t sum = 0;
    if (v)
      for (uint32_t x : *v) sum += x < 4 ? x : 0;
    return sum;
  };
  volatile uint64_t sink = e->request_id();
  switch (e->msg_type()) {
    case wire::Message::Hello:
      if (auto* h = e->msg_as_Hello()) {
        sink = sink + h->protocol_version() + static_cast<uint8_t>(h->kind());
        if (h->client_name()) sink = sink + h->client_name()->size();
      }
      break;
    case wire::Message::Acquire:
      if (auto* a = e->msg_as_Acquire()) sink = sink + (a->layer() < 2) + ids(a->experts());
      break;
    case wire::Message::Prefetch:
      if (auto* p = e->msg_as_Prefetch()) sink = sink + (p->layer() < 2) + ids(p->experts());
      break;
    case wire::Message::Admin:
      if (auto* a = e->msg_as_Admin())
        sink = sink + static_cast<uint8_t>(a->op()) + ids(a->experts());
      break;
    case wire::Message::Release:
      if (auto* r = e->msg_as_Release()) sink = sink + r->lease_id();
      break;
    case wire::Message::HelloReply:  // what libexpertclient reads of the daemon's replies
      if (auto* h = e->msg_as_HelloReply(); h && h->layers())
        for (const auto* l : *h->layers())
          if (l->roles())
            for (const auto* r : *l->roles())
              sink = sink + r->offset() + (r->role() ? r->role()->size() : 0);
      break;
    case wire::Message::AcquireReply:
      if (auto* a = e->msg_as_AcquireReply(); a && a->slots() && a->ready())
        sink = sink + a->slots()->size() + a->ready()->size();
      break;
    case wire::Message::Ready:
      if (auto* r = e->msg_as_Ready(); r && r->message()) sink = sink + r->message()->size();
      break;
    case wire::Message::StatsReply:
      if (auto* s = e->msg_as_StatsReply(); s && s->metrics())
        for (const auto* m : *s->metrics()) sink = sink + (m->name() ? m->name()->size() : 0);
      break;
    case wire::Message::Error:
      if (auto* x = e->msg_as_Error(); x && x->message()) sink = sink + x->message()->size();
      break;
    case wire::Message::ExpertsReply:  // what Client::experts_json reads
      if (auto* x = e->msg_as_ExpertsReply(); x && x->residency() && x->hits())
        sink = sink + x->residency()->size() + x->hits()->size() + (x->engines() ? 1 : 0);
      break;
    default:
      break;
  }
  (void)sink;
}

}  // namespace

// A byte stream as the daemon reads a connection: u32 length (bounded) + body, verified.
int frames(const uint8_t* data, size_t size) {
  size_t at = 0;
  while (at + proto::kFrameHeaderBytes <= size) {
    uint32_t n;
    std::memcpy(&n, data + at, 4);
    at += proto::kFrameHeaderBytes;
    if (n == 0 || n > proto::kFrameBytesMaxDefault || n > size - at) break;  // the daemon closes
    std::vector<uint8_t> body(data + at, data + at + n);  // its own buffer, as the daemon's
    at += n;
    if (auto env = proto::verify_envelope(body)) read_message(*env);
  }
  return 0;
}

// The manifest loader; a manifest that loads and validates must round-trip through its own
// header (encode_header, then check_header accepts it) and through to_json.
int manifest(const uint8_t* data, size_t size) {
  auto m =
      pack::parse_manifest(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!m || !pack::validate(*m)) return 0;
  if (m->data_start > (64u << 20)) return 0;  // a header that large is refused when the pack opens
  auto h = pack::encode_header(*m);
  if (!pack::check_header(h, *m)) std::abort();  // an invariant, not an input error
  auto again = pack::parse_manifest(pack::to_json(*m), "fuzz round trip");
  if (!again || pack::to_json(*again) != pack::to_json(*m)) std::abort();
  return 0;
}

// The pack header of a file against its manifest (what expertd checks at start-up).
int pack_header(const uint8_t* data, size_t size) {
  static const pack::Manifest m = small_manifest();
  (void)pack::check_header(std::span<const uint8_t>(data, size), m);
  return 0;
}

std::vector<std::string> frame_seeds() {
  std::vector<std::string> v;
  auto add = [&](std::vector<uint8_t> f) { v.push_back(bytes(f)); };
  flatbuffers::FlatBufferBuilder a(256), b(256), c(256), d(256), e(256), f(256), g(256);
  std::vector<uint32_t> ids = {0, 3, 1};
  add(proto::make_frame(
      a, 1, wire::CreateHelloDirect(a, proto::kProtocolVersion, "seed", wire::ClientKind::Engine)));
  add(proto::make_frame(b, 2, wire::CreateAcquireDirect(b, 1, &ids)));
  add(proto::make_frame(c, 3, wire::CreateRelease(c, 7)));
  add(proto::make_frame(d, 4, wire::CreatePrefetchDirect(d, 0, &ids)));
  add(proto::make_frame(e, 5, wire::CreateAdminDirect(e, wire::AdminOp::Warmup, 1, &ids)));
  add(proto::make_frame(f, 6, wire::CreateStatsRequest(f)));
  add(proto::make_error_frame(7, wire::ErrorCode::Busy, "seed"));
  std::vector<flatbuffers::Offset<wire::RoleInfo>> roles = {
      wire::CreateRoleInfoDirect(g, "gate", 8, 256, 64, 0, 17408)};
  std::vector<flatbuffers::Offset<wire::LayerInfo>> layers = {
      wire::CreateLayerInfoDirect(g, 0, 20480, &roles)};
  add(proto::make_frame(
      g, 8,
      wire::CreateHelloReplyDirect(g, proto::kProtocolVersion, 1, 2, "qwen3moe", 4, 2, &layers)));
  std::string stream;
  for (const auto& s : v) stream += s;  // a connection's worth: every kind back to back
  v.push_back(stream);
  return v;
}

std::vector<std::string> manifest_seeds() {
  return {pack::to_json(small_manifest())};
}

std::vector<std::string> pack_header_seeds() {
  return {bytes(pack::encode_header(small_manifest()))};
}

}  // namespace expertd::fuzz

#ifdef EXPERTD_FUZZ_TARGET  // one libFuzzer binary per entry (tests/CMakeLists.txt)
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return expertd::fuzz::EXPERTD_FUZZ_TARGET(data, size);
}
#endif
