#include "serve/prefix_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace expertd::serve {

namespace {

constexpr size_t kAlign = 4096;
constexpr char kMagic[8] = {'E', 'X', 'P', 'F', 'X', '0', '2', '\0'};  // 02: n_bytes

struct Header {
  char magic[8];
  uint64_t model_id, n_tokens, n_past, n_bytes;  // n_bytes: the state's
  uint64_t tokens_xxh3, payload_xxh3;            // the token list; tokens and state together
  uint64_t header_xxh3;                          // the fields above
};
static_assert(sizeof(Header) <= kAlign);

size_t round_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

struct Aligned {
  void* p = nullptr;
  explicit Aligned(size_t n) {
    if (posix_memalign(&p, kAlign, std::max(n, kAlign)) != 0) p = nullptr;
  }
  ~Aligned() { std::free(p); }
  char* data() { return static_cast<char*>(p); }
};

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_all(int fd, char* p, size_t n, off_t off) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= size_t(r), off += r;
  }
  return true;
}

bool header_ok(const Header& h) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 &&
         XXH3_64bits(&h, offsetof(Header, header_xxh3)) == h.header_xxh3;
}

int64_t mtime_ns(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

PrefixDisk::PrefixDisk(std::string dir, uint64_t budget, uint64_t model_id)
    : dir_(std::move(dir)), budget_(budget), model_id_(model_id) {}

Result<std::unique_ptr<PrefixDisk>> PrefixDisk::open(const std::string& dir, uint64_t budget,
                                                     uint64_t model_id) {
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST)
    return errno_error("--prefix-cache-dir " + dir);
  // Fail closed: the tier is written with direct I/O or not at all.
  const std::string probe = dir + "/.probe-" + std::to_string(::getpid());
  {
    Fd f(::open(probe.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT | O_CLOEXEC, 0640));
    if (f.fd < 0)
      return errno_error("--prefix-cache-dir " + dir + ": cannot open a file with O_DIRECT");
    Aligned b(kAlign);
    std::memset(b.data(), 0, kAlign);
    const ssize_t w = ::pwrite(f.fd, b.data(), kAlign, 0);
    const int err = errno;
    ::unlink(probe.c_str());
    if (w != ssize_t(kAlign))
      return errno_error("--prefix-cache-dir " + dir + ": a 4096-byte O_DIRECT write failed", err);
  }
  std::unique_ptr<PrefixDisk> d(new PrefixDisk(dir, budget, model_id));
  d->scan();
  d->thread_ = std::thread([p = d.get()] { p->writer(); });
  return d;
}

PrefixDisk::~PrefixDisk() {
  flush();
  {
    std::lock_guard lk(qmu_);
    stop_ = true;
  }
  qcv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Every file's header and tokens; damaged ones are removed and counted.
void PrefixDisk::scan() {
  const int64_t mt = mtime_ns(dir_);
  DIR* dp = ::opendir(dir_.c_str());
  if (!dp) return;
  std::vector<std::pair<int64_t, Entry>> by_age;
  while (dirent* de = ::readdir(dp)) {
    const std::string name = de->d_name;
    if (name.size() < 5 || name.substr(name.size() - 4) != ".pfx") continue;
    const std::string path = dir_ + "/" + name;
    {
      std::lock_guard lk(mu_);
      if (std::any_of(entries_.begin(), entries_.end(),
                      [&](const Entry& x) { return x.file == path; }))
        continue;  // known already
    }
    Fd f(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    if (f.fd < 0) continue;
    struct stat st;
    if (::fstat(f.fd, &st) != 0) continue;
    Aligned hb(kAlign);
    if (!read_all(f.fd, hb.data(), kAlign, 0)) {
      ++c_.damaged;
      ::unlink(path.c_str());
      continue;
    }
    Header h;
    std::memcpy(&h, hb.data(), sizeof h);
    if (!header_ok(h) || uint64_t(st.st_size) != kAlign + round_up(h.n_tokens * 4 + h.n_bytes)) {
      ++c_.damaged;
      ::unlink(path.c_str());
      continue;
    }
    if (h.model_id != model_id_) continue;  // another model's: not ours to read or remove
    const size_t tok_bytes = round_up(h.n_tokens * 4);
    Aligned tb(tok_bytes);
    if (!read_all(f.fd, tb.data(), tok_bytes, kAlign) ||
        XXH3_64bits(tb.data(), h.n_tokens * 4) != h.tokens_xxh3) {
      ++c_.damaged;
      ::unlink(path.c_str());
      continue;
    }
    Entry e;
    e.file = path;
    e.tokens.resize(h.n_tokens);
    std::memcpy(e.tokens.data(), tb.data(), h.n_tokens * 4);
    e.bytes = uint64_t(st.st_size);
    by_age.push_back({int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, std::move(e)});
  }
  ::closedir(dp);
  std::sort(by_age.begin(), by_age.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::lock_guard lk(mu_);
  // Keep what this process knows of recency; files new to it join as the oldest known.
  for (auto& aged : by_age) {
    Entry& e = aged.second;
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry& x) { return x.file == e.file; });
    if (it != entries_.end()) continue;
    e.used = ++clock_;
    bytes_ += e.bytes;
    entries_.push_back(std::move(e));
  }
  std::erase_if(entries_, [&](const Entry& x) {
    const bool gone = ::access(x.file.c_str(), F_OK) != 0;
    if (gone) bytes_ -= x.bytes;
    return gone;
  });
  scanned_mtime_ns_ = mt;
}

std::optional<PrefixDisk::Entry> PrefixDisk::find(std::span<const int32_t> prompt, bool can_cut,
                                                  int& n) {
  n = 0;
  if (prompt.size() < 2) return std::nullopt;
  // Files another process wrote since the last look.
  if (mtime_ns(dir_) != scanned_mtime_ns_) scan();
  std::lock_guard lk(mu_);
  const size_t limit = prompt.size() - 1;
  Entry* best = nullptr;
  for (Entry& e : entries_) {
    size_t m = 0;
    const size_t upto = std::min(e.tokens.size(), limit);
    while (m < upto && e.tokens[m] == prompt[m]) ++m;
    if (!can_cut && m != e.tokens.size()) continue;
    if (int(m) > n) n = int(m), best = &e;
  }
  if (!best) return std::nullopt;
  best->used = ++clock_;
  return *best;
}

std::optional<engine::SeqState> PrefixDisk::read(const Entry& e) {
  auto damaged = [&]() -> std::optional<engine::SeqState> {
    ++c_.damaged;
    ::unlink(e.file.c_str());
    std::lock_guard lk(mu_);
    std::erase_if(entries_, [&](const Entry& x) {
      if (x.file != e.file) return false;
      bytes_ -= x.bytes;
      return true;
    });
    return std::nullopt;
  };
  Fd f(::open(e.file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
  if (f.fd < 0) return damaged();
  struct stat st;
  if (::fstat(f.fd, &st) != 0 || uint64_t(st.st_size) < kAlign) return damaged();
  Aligned buf(size_t(st.st_size));
  if (!buf.p || !read_all(f.fd, buf.data(), size_t(st.st_size), 0)) return damaged();
  Header h;
  std::memcpy(&h, buf.data(), sizeof h);
  const size_t payload = h.n_tokens * 4 + h.n_bytes;
  if (!header_ok(h) || h.model_id != model_id_ ||
      uint64_t(st.st_size) != kAlign + round_up(payload) ||
      XXH3_64bits(buf.data() + kAlign, payload) != h.payload_xxh3 ||
      h.n_tokens != e.tokens.size() ||
      std::memcmp(buf.data() + kAlign, e.tokens.data(), h.n_tokens * 4) != 0)
    return damaged();
  engine::SeqState s;
  s.n_past = int(h.n_past);
  s.data.resize(h.n_bytes);
  std::memcpy(s.data.data(), buf.data() + kAlign + h.n_tokens * 4, h.n_bytes);
  ++c_.reads;
  c_.read_bytes += uint64_t(st.st_size);
  return s;
}

void PrefixDisk::write(std::span<const int32_t> tokens, const engine::SeqState& s) {
  if (c_.full) return;
  {
    std::lock_guard lk(mu_);
    for (const Entry& e : entries_)
      if (e.tokens.size() == tokens.size() &&
          std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
        return;  // already on disk
  }
  {
    std::lock_guard lk(qmu_);
    auto same = [&](const std::vector<int32_t>& t) {
      return t.size() == tokens.size() && std::equal(t.begin(), t.end(), tokens.begin());
    };
    if (same(writing_)) return;  // being written
    for (const Job& j : queue_)
      if (same(j.tokens)) return;  // on its way
    if (queue_.size() >= kQueueMax) {
      ++c_.dropped;
      return;
    }
    queue_.push_back({std::vector<int32_t>(tokens.begin(), tokens.end()), s});
  }
  qcv_.notify_all();
}

void PrefixDisk::flush() {
  std::unique_lock lk(qmu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void PrefixDisk::writer() {
  std::unique_lock lk(qmu_);
  for (;;) {
    qcv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    Job j = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    writing_ = j.tokens;
    lk.unlock();
    if (!c_.full) write_file(j.tokens, j.state);
    lk.lock();
    busy_ = false;
    writing_.clear();
    idle_cv_.notify_all();
  }
}

bool PrefixDisk::write_file(const std::vector<int32_t>& tokens, const engine::SeqState& s) {
  const size_t payload = tokens.size() * 4 + s.data.size();
  const size_t total = kAlign + round_up(payload);
  if (total > budget_) return false;
  evict_to(budget_ - total);
  Aligned buf(total);
  if (!buf.p) return false;
  std::memset(buf.data(), 0, total);
  std::memcpy(buf.data() + kAlign, tokens.data(), tokens.size() * 4);
  std::memcpy(buf.data() + kAlign + tokens.size() * 4, s.data.data(), s.data.size());
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.model_id = model_id_, h.n_tokens = tokens.size(), h.n_past = uint64_t(s.n_past);
  h.n_bytes = s.data.size();
  h.tokens_xxh3 = XXH3_64bits(tokens.data(), tokens.size() * 4);
  h.payload_xxh3 = XXH3_64bits(buf.data() + kAlign, payload);
  h.header_xxh3 = XXH3_64bits(&h, offsetof(Header, header_xxh3));
  std::memcpy(buf.data(), &h, sizeof h);
  const std::string id = std::to_string(::getpid()) + "-" + std::to_string(++seq_);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h.tokens_xxh3));
  const std::string tmp = dir_ + "/.tmp-" + id, path = dir_ + "/" + hex + "-" + id + ".pfx";
  Fd f(::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_DIRECT | O_CLOEXEC, 0640));
  if (f.fd < 0) {
    ++c_.write_errors;
    return false;
  }
  size_t off = 0;
  while (off < total) {
    const ssize_t w = ::pwrite(f.fd, buf.data() + off, total - off, off_t(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (errno == ENOSPC || errno == EDQUOT) c_.full = true;
      ++c_.write_errors;
      ::unlink(tmp.c_str());
      return false;
    }
    off += size_t(w);
  }
  if (::fdatasync(f.fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ++c_.write_errors;
    ::unlink(tmp.c_str());
    return false;
  }
  ++c_.writes;
  c_.write_bytes += total;
  std::lock_guard lk(mu_);
  entries_.push_back({path, tokens, total, ++clock_});
  bytes_ += total;
  scanned_mtime_ns_ = mtime_ns(dir_);  // our own rename needs no rescan
  return true;
}

void PrefixDisk::evict_to(uint64_t budget) {
  std::lock_guard lk(mu_);
  while (bytes_ > budget && !entries_.empty()) {
    auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                   [](const Entry& a, const Entry& b) { return a.used < b.used; });
    ::unlink(oldest->file.c_str());
    bytes_ -= oldest->bytes;
    entries_.erase(oldest);
    ++c_.evictions;
  }
}

size_t PrefixDisk::entries() const {
  std::lock_guard lk(mu_);
  return entries_.size();
}

uint64_t PrefixDisk::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

}  // namespace expertd::serve
