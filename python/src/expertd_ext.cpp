// expertd for Python (the expertd package's _expertd module): libexpertclient's Client over
// nanobind, each ready expert's slot as a read-only NumPy array over the daemon's shared arena
// (no copy), and the kernels' dequantizers. Errors are expertd.Error naming the cause.
//
// A lease's memory stays the lease's while any view of it lives: each array holds the lease (its
// owner), and the daemon is told to release the slots only when the `with` block has ended and
// the last array is gone. A client acquires one lease at a time (the daemon's rule): acquiring
// while an earlier lease or one of its arrays is alive is an error saying so.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/expert_client.h"
#ifdef EXPERTD_PY_CUDA
#include "client/cuda_slots.h"
#endif
#include "kernels/kernels.h"
#include "kernels/types.h"

namespace nb = nanobind;
using expertd::client::Client;

namespace {

// The package's exception (expertd.Error, a RuntimeError), set at module creation.
PyObject* g_error = nullptr;

[[noreturn]] void raise(const std::string& why) {
  PyErr_SetString(g_error, why.c_str());
  throw nb::python_error();
}

struct Connection;

// What a Lease and its arrays share: released when the last of them lets go.
struct LeaseCore {
  std::shared_ptr<Connection> conn;
  expertd::client::Lease lease;
  std::vector<uint32_t> live;  // arrays alive per expert (done() refuses an expert with any)
  std::vector<uint8_t> given;  // returned by next_ready()
  ~LeaseCore();
};

// What an array owns: its lease, and one count of its expert's live arrays.
struct ArrayOwner {
  std::shared_ptr<LeaseCore> core;
  size_t expert;
  ArrayOwner(std::shared_ptr<LeaseCore> c, size_t i) : core(std::move(c)), expert(i) {
    ++core->live[expert];
  }
  ~ArrayOwner() { --core->live[expert]; }
};

struct Connection {
  std::unique_ptr<Client> client;
#ifdef EXPERTD_PY_CUDA
  // A cuda expertd's slot arena, opened (CUDA IPC) on the first device access; the daemon's GPU
  // becomes the current device.
  std::unique_ptr<expertd::client::CudaSlots> cuda;
  int cuda_device = 0;
  expertd::client::CudaSlots& slots() {
    if (!cuda) {
      auto s = expertd::client::CudaSlots::open(get().info());
      if (!s) raise(s.error().message);
      cuda = std::move(*s);
      if (cudaGetDevice(&cuda_device) != cudaSuccess) cuda_device = 0;
    }
    return *cuda;
  }
#endif
  std::weak_ptr<LeaseCore> current;          // the lease (or its arrays) still alive
  std::optional<std::string> release_error;  // a release that failed where nothing could raise
  Client& get() {
    if (!client) raise("the client is closed");
    if (release_error) {
      std::string e = *release_error;
      release_error.reset();
      raise("an earlier release failed: " + e);
    }
    return *client;
  }
};

LeaseCore::~LeaseCore() {
  if (!conn->client) return;
  if (auto st = conn->client->release(lease); !st) conn->release_error = st.error().message;
}

const expertd::client::LayerView& layer_view(Connection& c, uint32_t layer) {
  const auto& info = c.get().info();
  if (layer >= info.layers.size())
    raise("no pack layer " + std::to_string(layer) + " (the pack has " +
          std::to_string(info.layers.size()) + " MoE layers)");
  return info.layers[layer];
}

class PyLease {
 public:
  explicit PyLease(std::shared_ptr<LeaseCore> core) : core_(std::move(core)) {}

  size_t size() const { return core().lease.experts.size(); }
  std::vector<uint32_t> experts() const { return core().lease.experts; }
  uint32_t layer() const { return core().lease.layer; }
  bool is_ready(size_t i) const {
    check_index(i);
    return core().lease.ready[i] != 0;
  }
  // Blocks until expert i (or, with None, every expert) is ready.
  void wait(std::optional<size_t> i) {
    auto& c = core();
    if (i) check_index(*i);
    if (auto st = c.conn->get().wait_ready(c.lease, i); !st) raise(st.error().message);
    for (size_t k = 0; k < c.lease.errors.size(); ++k)
      if ((!i || *i == k) && !c.lease.errors[k].empty())
        raise("expert " + std::to_string(c.lease.experts[k]) + " of layer " +
              std::to_string(c.lease.layer) + ": " + c.lease.errors[k]);
  }
  // The index of one more expert that is ready (each expert once: those ready in the acquire's
  // reply first), or None when every expert has been returned.
  std::optional<size_t> next_ready() {
    auto& c = core();
    if (c.given.size() != c.lease.ready.size()) c.given.assign(c.lease.ready.size(), 0);
    for (;;) {
      for (size_t i = 0; i < c.given.size(); ++i)
        if ((c.lease.ready[i] || !c.lease.errors[i].empty()) && !c.given[i]) {
          c.given[i] = 1;
          return i;
        }
      auto r = c.conn->get().next_ready(c.lease);
      if (!r) raise(r.error().message);
      if (!*r) return std::nullopt;  // nothing pending: every expert was returned above
    }
  }
  // Expert i's slot: a read-only uint8 array (waits for the expert first).
  nb::object view(size_t i) {
    auto m = slot(i, std::nullopt);
    host_only(m);
    return array<nb::numpy>(i, m);
  }
  // One role of expert i (gate, up, down, ...): F32 as float32 and F16 as float16 rows
  // (ne1 x ne0); any other type as its raw rows (ne1 x row bytes, uint8) for dequantize().
  nb::object tensor(size_t i, const std::string& role) {
    auto m = slot(i, role);
    host_only(m);
    return array<nb::numpy>(i, m);
  }
  // The same memory as a torch.Tensor (DLPack, no copy): the whole slot, or one role as tensor().
  // torch has no read-only tensors: the arena is mapped read-only, so a write faults.
  // On a cuda expertd it is a CUDA tensor over the slot's IPC mapping, ready for work on the
  // legacy default stream (which was made to wait for the slot's copy).
  nb::object torch(size_t i, std::optional<std::string> role) {
    auto m = slot(i, role);
    try {
      nb::module_::import_("torch");
    } catch (nb::python_error& e) {
      raise("Lease.torch needs torch, which does not import here: " + std::string(e.what()));
    }
    return array<nb::pytorch>(i, m);
  }
  // (address, bytes, device) of expert i's slot or one role of it: for consumers that take raw
  // pointers (CuPy, custom kernels). device is "cpu" or "cuda:N"; the pointer stays valid while
  // the lease lives and the expert is not handed back.
  nb::tuple pointer(size_t i, std::optional<std::string> role) {
    auto m = slot(i, role);
    size_t bytes = m.dt.bits / 8;
    for (size_t d : m.shape) bytes *= d;
    std::string dev = "cpu";
#ifdef EXPERTD_PY_CUDA
    if (m.device) dev = "cuda:" + std::to_string(core().conn->cuda_device);
#endif
    return nb::make_tuple(uintptr_t(m.p), bytes, dev);
  }
  // The engine is finished with these experts: their slots go back to the daemon now (not at
  // the lease's end), which lets an acquire of more experts than one request may pin
  // (info()["max_experts_per_request"]) go on with its next wave. An expert with a live array
  // is refused: its slot would be given to another expert under it.
  void done(std::vector<size_t> idx) {
    auto& c = core();
    for (size_t i : idx) {
      check_index(i);
      if (!c.lease.ready[i])
        raise("expert " + std::to_string(c.lease.experts[i]) + " (index " + std::to_string(i) +
              ") is not ready yet: only ready experts can be handed back");
      if (c.live[i])
        raise("expert " + std::to_string(c.lease.experts[i]) + " (index " + std::to_string(i) +
              ") still has " + std::to_string(c.live[i]) +
              " array(s) over its slot: drop them (or copy what you keep) before done()");
    }
    std::vector<size_t> todo;
    for (size_t i : idx)
      if (!c.lease.done[i]) todo.push_back(i);
    if (todo.empty()) return;
    if (auto st = c.conn->get().done(c.lease, todo); !st) raise(st.error().message);
  }
  bool is_done(size_t i) const {
    check_index(i);
    return core().lease.done[i] != 0;
  }
  void close() {
    core_.reset();
  }  // the `with` block's end: released once no array holds it
  bool closed() const {
    return !core_;
  }

 private:
  LeaseCore& core() const {
    if (!core_) raise("the lease was released (its `with` block ended)");
    return *core_;
  }
  void check_index(size_t i) const {
    if (i >= core().lease.experts.size())
      raise("no expert " + std::to_string(i) + " in this lease of " +
            std::to_string(core().lease.experts.size()));
  }
  struct Memory {
    const uint8_t* p;
    std::vector<size_t> shape;
    nb::dlpack::dtype dt;
    bool device = false;  // p is in a cuda expertd's VRAM arena
  };
  // Expert i's slot, or one role of it, once it is ready.
  Memory slot(size_t i, const std::optional<std::string>& role) {
    wait(i);
    auto& c = core();
    if (c.lease.done[i])
      raise("expert " + std::to_string(c.lease.experts[i]) +
            " was handed back with done(): its slot may hold another expert now");
    const uint8_t* base = slot_base(i);
    if (!role)
      return {base, {size_t(c.lease.slot_bytes)}, nb::dtype<uint8_t>(), c.lease.base == nullptr};
    const auto& lv = layer_view(*c.conn, c.lease.layer);
    const auto* r = lv.find(*role);
    if (!r) {
      std::string have;
      for (const auto& x : lv.roles) have += (have.empty() ? "" : ", ") + x.role;
      raise("layer " + std::to_string(c.lease.layer) + " has no role '" + *role + "' (" + have +
            ")");
    }
    const uint8_t* p = base + r->offset;
    const bool dev = c.lease.base == nullptr;
    if (r->ggml_type == kernels::F32)
      return {p, {size_t(r->ne1), size_t(r->ne0)}, nb::dtype<float>(), dev};
    if (r->ggml_type == kernels::F16)
      return {p,
              {size_t(r->ne1), size_t(r->ne0)},
              nb::dlpack::dtype{uint8_t(nb::dlpack::dtype_code::Float), 16, 1},
              dev};
    const size_t rb = r->bytes / (r->ne1 ? r->ne1 : 1);
    return {p, {size_t(r->ne1), rb}, nb::dtype<uint8_t>(), dev};
  }
  // The slot of expert i: host memory, or a cuda arena's device memory once the legacy default
  // stream waits for the slot's copy (its interprocess event).
  const uint8_t* slot_base(size_t i) {
    auto& c = core();
    if (c.lease.base) return c.lease.slot_data(i);
#ifdef EXPERTD_PY_CUDA
    auto& slots = c.conn->slots();
    if (auto st = slots.wait(nullptr, c.lease.slots[i]); !st) raise(st.error().message);
    return slots.slot_ptr(c.lease.slots[i]);
#else
    raise(
        "expertd's arena is in VRAM (--backend cuda) and this build of the package has no CUDA "
        "support (built where the CUDA toolkit was not found)");
#endif
  }
  // An array of the framework over p (read-only where the framework has that) that keeps the
  // lease, and expert i's slot, alive while it lives.
  template <class Framework>
  nb::object array(size_t i, const Memory& m) {
    auto* keep = new ArrayOwner(core_, i);
    nb::capsule owner(keep, [](void* k) noexcept { delete static_cast<ArrayOwner*>(k); });
    int dev_type = nb::device::cpu::value, dev_id = 0;
#ifdef EXPERTD_PY_CUDA
    if (m.device) dev_type = nb::device::cuda::value, dev_id = core().conn->cuda_device;
#endif
    nb::ndarray<Framework, nb::ro> a(m.p, m.shape.size(), m.shape.data(), owner, nullptr, m.dt,
                                     dev_type, dev_id);
    return nb::cast(a);
  }
  static void host_only(const Memory& m) {
    if (m.device)
      raise(
          "expertd's arena is in VRAM (--backend cuda): NumPy cannot view it; use "
          "lease.torch(i) for a CUDA tensor, or lease.pointer(i)");
  }
  std::shared_ptr<LeaseCore> core_;
};

class PyClient {
 public:
  static PyClient connect(const std::string& path, const std::string& name, bool monitor) {
    Client::Options o;
    o.name = name;
    o.monitor = monitor;  // stats only: no engine place, no arena
    auto c = Client::connect(path, o);
    if (!c) raise(c.error().message);
    PyClient p;
    p.conn_ = std::make_shared<Connection>();
    p.conn_->client = std::move(*c);
    return p;
  }

  nb::dict info() {
    const auto& i = conn_->get().info();
    nb::dict d;
    d["arch"] = i.arch;
    d["model_id"] = i.model_id;
    d["n_experts"] = i.n_experts;
    d["n_experts_used"] = i.n_experts_used;
    d["arena"] = i.arena_kind;
    d["slot_bytes"] = i.slot_bytes;
    d["slot_count"] = i.slot_count;
    d["max_experts_per_request"] = i.max_experts_per_request;
    nb::list layers;
    for (const auto& l : i.layers) {
      nb::dict ld;
      ld["model_layer"] = l.model_layer;
      nb::list roles;
      for (const auto& r : l.roles) {
        nb::dict rd;
        rd["role"] = r.role;
        rd["type"] = r.ggml_type;
        const auto* t = kernels::type_traits(r.ggml_type);
        rd["type_name"] = std::string(t ? t->name : "?");
        rd["shape"] = nb::make_tuple(r.ne1, r.ne0);
        rd["offset"] = r.offset;
        rd["bytes"] = r.bytes;
        roles.append(rd);
      }
      ld["roles"] = roles;
      layers.append(ld);
    }
    d["layers"] = layers;
    return d;
  }

  PyLease acquire(uint32_t layer, std::vector<uint32_t> experts) {
    Client& c = conn_->get();
    (void)layer_view(*conn_, layer);
    if (!conn_->current.expired())
      raise(
          "an earlier lease of this client is still held (its `with` block, or an array "
          "viewing it, is alive): end it, or copy the arrays you keep");
    for (uint32_t e : experts)
      if (e >= c.info().n_experts)
        raise("no expert " + std::to_string(e) + " (the model has " +
              std::to_string(c.info().n_experts) + ")");
    auto l = c.acquire(layer, experts);
    if (!l) raise(l.error().message);
    auto core = std::make_shared<LeaseCore>();
    core->conn = conn_;
    core->lease = std::move(*l);
    core->live.assign(core->lease.experts.size(), 0);
    conn_->current = core;
    return PyLease(std::move(core));
  }

  void prefetch(uint32_t layer, std::vector<uint32_t> experts) {
    (void)layer_view(*conn_, layer);
    if (auto st = conn_->get().prefetch(layer, experts); !st) raise(st.error().message);
  }

  nb::dict stats() {
    auto s = conn_->get().stats();
    if (!s) raise(s.error().message);
    nb::dict d;
    for (const auto& m : *s) d[m.name.c_str()] = m.value;
    return d;
  }

  void close() {
    if (!conn_->current.expired())
      raise("a lease of this client is still held: end its `with` block and drop its arrays");
    conn_->client.reset();
  }

 private:
  std::shared_ptr<Connection> conn_;
};

// F32 values of a row-major block of rows of `type` (ne1 rows of ne0), from their bytes.
nb::object dequantize(nb::ndarray<const uint8_t, nb::c_contig> src, uint32_t type,
                      std::vector<int64_t> shape,
                      std::optional<nb::ndarray<float, nb::c_contig, nb::device::cpu>> out) {
  const auto* t = kernels::type_traits(type);
  if (!t) raise("unknown GGML type " + std::to_string(type));
  if (!kernels::weight_type_supported(type))
    raise(std::string("cannot dequantize ") + t->name + ": the kernels run " +
          kernels::supported_type_names());
  if (shape.empty() || shape.size() > 2) raise("shape: (columns,) or (rows, columns)");
  const int64_t cols = shape.back(), rows = shape.size() == 2 ? shape[0] : 1;
  if (cols <= 0 || rows <= 0 || cols % t->block_elems)
    raise("a row of " + std::string(t->name) + " holds a multiple of " +
          std::to_string(t->block_elems) + " values, not " + std::to_string(cols));
  const size_t rb = kernels::row_size(type, cols);
  if (src.size() < rb * size_t(rows))
    raise("the bytes (" + std::to_string(src.size()) + ") are fewer than " + std::to_string(rows) +
          " rows of " + std::to_string(cols) + " " + t->name + " (" +
          std::to_string(rb * size_t(rows)) + ")");
  if (out) {  // into the caller's float32 array (no allocation)
    if (out->size() != size_t(rows * cols))
      raise("out holds " + std::to_string(out->size()) + " floats, not " +
            std::to_string(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      kernels::dequantize_row(type, src.data() + rb * size_t(r), out->data() + r * cols, cols);
    return nb::cast(*out);
  }
  auto* buf = new float[size_t(rows * cols)];
  for (int64_t r = 0; r < rows; ++r)
    kernels::dequantize_row(type, src.data() + rb * size_t(r), buf + r * cols, cols);
  nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  size_t dims[2] = {size_t(rows), size_t(cols)};
  return nb::cast(
      nb::ndarray<nb::numpy, float>(buf, shape.size(), shape.size() == 2 ? dims : dims + 1, owner));
}

}  // namespace

NB_MODULE(_expertd, m) {
  m.doc() = "expertd's client: experts from a shared expertd cache as zero-copy arrays";
  g_error =
      PyErr_NewExceptionWithDoc("expertd.Error", "an expertd error: the message names the cause",
                                PyExc_RuntimeError, nullptr);
  m.attr("Error") = nb::handle(g_error);

  nb::class_<PyLease>(m, "Lease")
      .def("__len__", &PyLease::size)
      .def_prop_ro("experts", &PyLease::experts)
      .def_prop_ro("layer", &PyLease::layer)
      .def_prop_ro("closed", &PyLease::closed)
      .def("is_ready", &PyLease::is_ready, nb::arg("i"))
      .def("wait", &PyLease::wait, nb::arg("i") = nb::none())
      .def("next_ready", &PyLease::next_ready)
      .def("view", &PyLease::view, nb::arg("i"))
      .def("tensor", &PyLease::tensor, nb::arg("i"), nb::arg("role"))
      .def("torch", &PyLease::torch, nb::arg("i"), nb::arg("role") = nb::none())
      .def("pointer", &PyLease::pointer, nb::arg("i"), nb::arg("role") = nb::none())
      .def("done", &PyLease::done, nb::arg("indices"))
      .def("is_done", &PyLease::is_done, nb::arg("i"))
      .def("close", &PyLease::close);

  nb::class_<PyClient>(m, "Client")
      .def_static("connect", &PyClient::connect, nb::arg("path"),
                  nb::arg("name") = std::string("python"), nb::arg("monitor") = false)
      .def("info", &PyClient::info)
      .def("acquire", &PyClient::acquire, nb::arg("layer"), nb::arg("experts"))
      .def("prefetch", &PyClient::prefetch, nb::arg("layer"), nb::arg("experts"))
      .def("stats", &PyClient::stats)
      .def("close", &PyClient::close);

  m.def("dequantize", &dequantize, nb::arg("data"), nb::arg("type"), nb::arg("shape"),
        nb::arg("out") = nb::none());
  m.def("type_id", [](const std::string& name) {
    const auto* t = kernels::type_by_name(name);
    if (!t) raise("unknown GGML type '" + name + "'");
    return t->id;
  });
}
