// The page expert-serve serves at / (serve/web/: a chat and a live dashboard, plain HTML, CSS and
// JavaScript, no build step): its files found at start and read once into memory.
#pragma once

#include <map>
#include <string>

#include "common/result.h"

namespace expertd::serve {

struct WebFile {
  std::string content_type;
  std::string body;
};

class WebFiles {
 public:
  // The files of `dir` the page is made of (a fixed list: nothing else under it is served).
  static Result<WebFiles> load(const std::string& dir);
  // The directory where they are: beside an installed binary (<bin>/../share/expertd/web), the
  // source tree's serve/web for a binary of the build tree, else the install prefix's; "" if none.
  static std::string find(const std::string& exe_path);
  // The file for a request's path ("/" is index.html); null if none.
  const WebFile* get(const std::string& path) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, WebFile> files_;  // by request path
};

}  // namespace expertd::serve
