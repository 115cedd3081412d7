#include "serve/web.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace expertd::serve {

namespace fs = std::filesystem;

namespace {

// The page's files and their types: the whole of what / serves.
constexpr struct {
  const char* name;
  const char* type;
} kFiles[] = {
    {"index.html", "text/html; charset=utf-8"},
    {"app.css", "text/css; charset=utf-8"},
    {"chat.js", "text/javascript; charset=utf-8"},
    {"dashboard.js", "text/javascript; charset=utf-8"},
    {"app.js", "text/javascript; charset=utf-8"},
};

bool has_page(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "index.html", ec);
}

}  // namespace

Result<WebFiles> WebFiles::load(const std::string& dir) {
  WebFiles w;
  w.dir_ = dir;
  for (const auto& f : kFiles) {
    const fs::path p = fs::path(dir) / f.name;
    std::ifstream in(p, std::ios::binary);
    if (!in) return Error{"the page's file " + p.string() + " cannot be read"};
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string path =
        std::string(f.name) == "index.html" ? "/" : std::string("/web/") + f.name;
    w.files_[path] = {f.type, ss.str()};
  }
  return w;
}

std::string WebFiles::find(const std::string& exe_path) {
  std::error_code ec;
  const fs::path exe = fs::canonical(exe_path, ec);
  if (!ec) {
    if (const fs::path p = exe.parent_path().parent_path() / "share" / "expertd" / "web";
        has_page(p))
      return p.string();
    const std::string build = EXPERTD_BUILD_DIR;
    if (exe.string().starts_with(build + "/") && has_page(EXPERTD_SOURCE_WEB))
      return EXPERTD_SOURCE_WEB;
  }
  if (has_page(EXPERTD_INSTALLED_WEB)) return EXPERTD_INSTALLED_WEB;
  if (has_page(EXPERTD_SOURCE_WEB)) return EXPERTD_SOURCE_WEB;
  return "";
}

const WebFile* WebFiles::get(const std::string& path) const {
  const auto it = files_.find(path == "/index.html" ? "/" : path);
  return it == files_.end() ? nullptr : &it->second;
}

}  // namespace expertd::serve
